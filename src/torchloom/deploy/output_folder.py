"""A results folder that appears whole or not at all: `loom quantize` and `loom export` write
into a hidden staging folder next to the target and rename it into place at the end, so a
failed or refused command never leaves half a folder, nor touches an earlier result (which
only `--force` replaces, and only once the new one is complete)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from torchloom.errors import DeployError


def refuse_existing(target: Path, force: bool, command: str) -> None:
    """A DeployError when `target` holds an earlier result and `force` is off."""
    if target.exists() and not force:
        raise DeployError.at(
            "",
            f"'{target}'",
            f"already holds the results of an earlier `{command}`",
            "add --force to replace them; they are kept until the new ones are complete",
        )


@contextlib.contextmanager
def staged_folder(target: Path, force: bool, command: str) -> Iterator[Path]:
    """A new empty folder to write into; renamed to `target` when the block succeeds, removed
    when it fails."""
    refuse_existing(target, force, command)
    target.parent.mkdir(parents=True, exist_ok=True)
    token = f"{os.getpid()}.{secrets.token_hex(4)}"
    staging = target.with_name(f".{target.name}.{token}.part")
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    old = target.with_name(f".{target.name}.{token}.old")
    if target.exists():
        os.replace(target, old)
    os.replace(staging, target)
    shutil.rmtree(old, ignore_errors=True)
