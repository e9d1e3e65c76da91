"""Writing a file in a data folder so that no reader ever sees half of it, and saying plainly
when the folder cannot be written."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from torchloom.errors import DataError, Problem


class FolderNotWritable(DataError):
    """A data folder cannot be written (read-only, no permission, full disk, a file size
    limit). Raised with the OS's reason, so that it is never blamed on the mirrors or the
    archive, and never caught as a failed download."""


@contextlib.contextmanager
def writing_into(path: Path) -> Iterator[None]:
    """The OS errors of the block, which writes `path`, as a `FolderNotWritable` naming its
    folder, the file and the OS's reason. Only writes belong in the block: a read error of a
    source is not the folder's fault."""
    try:
        yield
    except OSError as error:
        reason = error.strerror or str(error)
        problem = Problem(
            str(path.parent),
            "data folder",
            f"cannot be written ({reason}) when writing {path.name}",
            "make it writable or choose another data_folder; a folder that already holds every "
            "file is only read",
        )
        raise FolderNotWritable([problem]) from error


def temporary_name(dest: Path) -> Path:
    """A unique hidden name next to `dest` (so that renaming it to `dest` is atomic)."""
    return dest.with_name(f".{dest.name}.{os.getpid()}.{secrets.token_hex(4)}.part")


@contextlib.contextmanager
def atomic_file(dest: Path) -> Iterator[BinaryIO]:
    """Open a binary file to write `dest` through: a unique hidden name next to it, renamed
    to `dest` when the block ends without an error, removed otherwise. Two processes writing
    the same file at once each write their own temporary file; the last rename wins, and
    either way `dest` is always a whole file. Failing to create, close or rename the file is
    a `FolderNotWritable`; the block should wrap its own writes in `writing_into(dest)`."""
    temporary = temporary_name(dest)
    try:
        with writing_into(dest):
            out = open(temporary, "wb")  # noqa: SIM115 (the `with` below closes it)
        with out:
            yield out
            with writing_into(dest):
                out.flush()
        with writing_into(dest):
            os.replace(temporary, dest)
    finally:
        temporary.unlink(missing_ok=True)
