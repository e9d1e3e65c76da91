"""Writing a file in a data folder so that no reader ever sees half of it."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_file(dest: Path) -> Iterator[BinaryIO]:
    """Open a binary file to write `dest` through: a unique hidden name next to it, renamed
    to `dest` when the block ends without an error, removed otherwise. Two processes writing
    the same file at once each write their own temporary file; the last rename wins, and
    either way `dest` is always a whole file."""
    temporary = dest.with_name(f".{dest.name}.{os.getpid()}.{secrets.token_hex(4)}.part")
    try:
        with open(temporary, "wb") as out:
            yield out
        os.replace(temporary, dest)
    finally:
        temporary.unlink(missing_ok=True)
