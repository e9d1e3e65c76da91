"""Writing a file so that no reader ever sees half of it, and a failed write leaves nothing.

Every file torchloom writes whole (checkpoints, summaries, configs, data caches, reports)
goes through `atomic_file`: a unique hidden name next to the target, renamed over it when
complete, removed when anything fails (a full disk included), so the previous version stays
intact and no temporary file is left behind. Writes into a data folder also say plainly when
the folder cannot be written (`writing_into`, `FolderNotWritable`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from torchloom.errors import ConfigError, DataError, Problem


class FolderNotWritable(DataError):
    """A data folder cannot be written (read-only, no permission, full disk, a file size
    limit). Raised with the OS's reason, so that it is never blamed on the mirrors or the
    archive, and never caught as a failed download."""


@contextlib.contextmanager
def writing_into(path: Path) -> Iterator[None]:
    """The OS errors of the block, which writes `path` into a data folder, as a
    `FolderNotWritable` naming its folder, the file and the OS's reason. Only writes belong in
    the block: a read error of a source is not the folder's fault."""
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


class PendingFile:
    """A binary file that appears at `dest` whole or not at all: written under a unique hidden
    name next to it, renamed to `dest` by `commit()`, removed by `discard()`. For a file
    written over time (a report streamed over a pass); `atomic_file` is its `with` form.
    `data_folder`: an OS error creating, flushing or renaming it is a `FolderNotWritable`."""

    def __init__(self, dest: Path, data_folder: bool = False) -> None:
        self.dest = dest
        self.temporary = temporary_name(dest)
        self._guard = (lambda: writing_into(dest)) if data_folder else contextlib.nullcontext
        with self._guard():
            self.handle: BinaryIO = open(self.temporary, "wb")  # noqa: SIM115 (closed below)

    def commit(self, durable: bool = False) -> None:
        """Rename the finished file to `dest`. `durable` also flushes the file and its
        folder to the disk first (checkpoints: a power cut must not lose the one kept)."""
        try:
            with self._guard():
                self.handle.flush()
                if durable:
                    os.fsync(self.handle.fileno())
                self.handle.close()
                os.replace(self.temporary, self.dest)
            if durable:
                sync_folder(self.dest.parent)
        finally:
            self.discard()  # after a rename there is nothing left to remove

    def discard(self) -> None:
        try:
            self.handle.close()
        except OSError:
            pass  # a full disk cannot flush what is still buffered: the file goes anyway
        finally:
            self.temporary.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_file(dest: Path, durable: bool = False, data_folder: bool = False) -> Iterator[BinaryIO]:
    """Open a binary file to write `dest` through (see `PendingFile`): renamed to `dest` when
    the block ends without an error, removed otherwise. Two processes writing the same file
    at once each write their own temporary file; the last rename wins, and either way `dest`
    is always a whole file. With `data_folder`, the block wraps its own writes in
    `writing_into(dest)`."""
    pending = PendingFile(dest, data_folder)
    try:
        yield pending.handle
    except BaseException:
        pending.discard()
        raise
    pending.commit(durable)


def write_text_atomic(path: Path, text: str) -> None:
    """`path` holds `text` whole, or keeps what it held (see `atomic_file`); its folder is
    created when missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
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


def sync_tree(folder: Path) -> None:
    """Flush every file under `folder` and every folder's entries to the disk: a folder that
    several writers filled (torch.save, ONNX, torch.export), about to be renamed into place,
    so that a power cut after the rename cannot leave empty or partial files in it."""
    for root, _, files in os.walk(folder, topdown=False):
        for name in files:
            path = Path(root) / name
            if path.is_symlink():
                continue
            with open(path, "rb") as handle:  # a read-only descriptor is enough for fsync
                os.fsync(handle.fileno())
        sync_folder(Path(root))


def refuse_links(folder: Path, journal: str | None = None) -> None:
    """A run (or search) folder may come from someone else, and a copy (a tarball) keeps its
    symbolic links: a command that writes into the folder refuses one whose entries are links,
    which would have it write where they lead (`exports -> ../elsewhere`: the export landed
    outside, and the command named the path inside). `journal`: a search folder's Optuna
    journal (its file name), whose writer holds `<journal>.lock`, a link to the journal, for a
    moment at each write: that one link is no redirection (refused, it failed a `--workers 2`
    resume whose other worker was writing, by chance)."""
    lock = f"{journal}.lock" if journal else None
    links = sorted(
        entry.name
        for entry in Path(folder).iterdir()
        if entry.is_symlink() and not (entry.name == lock and _journal_lock(entry, journal))
    )
    if links:
        raise ConfigError.at(
            "",
            f"folder '{folder}'",
            f"holds symbolic links ({', '.join(links)}): what is written there would go "
            "where they lead, outside the folder",
            "copy the folder without its links (cp -rL), or remove them",
        )


def _journal_lock(entry: Path, journal: str | None) -> bool:
    """Whether the link `entry` leads to the regular file `journal` beside it, as the kernel
    follows it (or is gone already: the write it locked has ended). Anything else, a loop
    included, is a link to refuse."""
    if not os.path.lexists(entry):
        return True
    target = entry.parent / str(journal)
    try:
        return target.is_file() and not target.is_symlink() and os.path.samefile(entry, target)
    except (OSError, RuntimeError):
        return False
