"""A results folder that appears whole or not at all: `loom quantize` and `loom export` write
into a hidden staging folder next to the target and rename it into place at the end, so a
failed or refused command never leaves half a folder, nor touches an earlier result (which
only `--force` replaces, and only once the new one is complete).

The swap is durable: every file of the new folder and its entries are flushed to the disk
before the rename, the parent folder after it, and only then is the old folder removed. What
other commands wrote inside the old folder and must outlive a new result (`keep`: a quantized
folder's `process/`, the results of `loom process` on it) is moved into the new one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

from torchloom.data.atomic_files import sync_folder, sync_tree
from torchloom.errors import DeployError


def refuse_existing(target: Path, force: bool, command: str, resuming: bool = False) -> None:
    """A DeployError when `target` holds an earlier result and `force` is off (`resuming`:
    the command continues a fine-tuning, whose results would go there too)."""
    if target.exists() and not force:
        why = "the fine-tuning --resume continues converts into it, " if resuming else ""
        raise DeployError.at(
            "",
            f"'{target}'",
            f"already holds the results of an earlier `{command}`",
            f"{why}add --force to replace them; they are kept until the new ones are complete",
        )


@contextlib.contextmanager
def staged_folder(
    target: Path, force: bool, command: str, keep: Sequence[str] = ()
) -> Iterator[Path]:
    """A new empty folder to write into; renamed to `target` when the block succeeds, removed
    when it fails. The entries named in `keep` of an earlier `target` are moved into the new
    one (the block must not write them)."""
    refuse_existing(target, force, command)
    target.parent.mkdir(parents=True, exist_ok=True)
    token = f"{os.getpid()}.{secrets.token_hex(4)}"
    staging = target.with_name(f".{target.name}.{token}.part")
    staging.mkdir()
    try:
        yield staging
        sync_tree(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    old = target.with_name(f".{target.name}.{token}.old")
    if target.exists():
        os.replace(target, old)
        for name in keep:
            if (old / name).exists() and not (staging / name).exists():
                os.replace(old / name, staging / name)
        sync_folder(staging)
    os.replace(staging, target)
    sync_folder(target.parent)
    shutil.rmtree(old, ignore_errors=True)
