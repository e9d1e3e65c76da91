"""Writing a file so that no reader ever sees half of it, and a failed write leaves nothing.

Every file torchloom writes whole (checkpoints, summaries, configs, data caches, reports)
goes through `atomic_file`: a unique hidden name next to the target, renamed over it when
complete, removed when anything fails (a full disk included), so the previous version stays
intact and no temporary file is left behind.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_file(dest: Path, durable: bool = False) -> Iterator[BinaryIO]:
    """Open a binary file to write `dest` through: a unique hidden name next to it, renamed
    to `dest` when the block ends without an error, removed otherwise. Two processes writing
    the same file at once each write their own temporary file; the last rename wins, and
    either way `dest` is always a whole file. `durable` also flushes the file and its folder
    to the disk before returning (checkpoints: a power cut must not lose the one kept)."""
    temporary = dest.with_name(f".{dest.name}.{os.getpid()}.{secrets.token_hex(4)}.part")
    try:
        with open(temporary, "wb") as out:
            yield out
            if durable:
                out.flush()
                os.fsync(out.fileno())
        os.replace(temporary, dest)
        if durable:
            sync_folder(dest.parent)
    finally:
        temporary.unlink(missing_ok=True)


def write_text_atomic(path: Path, text: str) -> None:
    """`path` holds `text` whole, or keeps what it held (see `atomic_file`)."""
    with atomic_file(path) as out:
        out.write(text.encode("utf-8"))


def sync_folder(folder: Path) -> None:
    """Flush a folder's entries (a rename into it) to the disk, where the OS allows it."""
    with contextlib.suppress(OSError):
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
