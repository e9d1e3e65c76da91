"""Data sources made of named files with known md5 checksums.

`ensure_files` is the one entry point a task needs: it returns a folder in which every file is
present and verified, taking each missing file from (in this order) a packaged copy installed
with pip or apt, a download mirror, or nowhere, in which case the error says which files were
expected where and how to get them. Four rules hold throughout:

- a file already in the folder is never overwritten: a wrong checksum there is the user's to
  look at (a partial copy, a different release), so it is an error naming both checksums;
- every file is written to a temporary name in the destination folder and renamed only once
  its checksum matches, so an interrupted copy or download never leaves a half file behind and
  two processes preparing the same folder at once both end with the right file;
- nothing is written outside the destination folder;
- a folder that cannot be written is a `FolderNotWritable` error with the OS's reason.

Where each file came from (already in the folder, copied from a packaged copy, downloaded)
is recorded in an `Origins` when the caller passes one: tasks note it, and every run's log
says where its data came from. A packaged copy is not a download: it is used even when
downloading is not allowed.
"""

from __future__ import annotations

import hashlib
import http.client
import importlib.util
import os
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from torchloom.data.atomic_files import FolderNotWritable, PendingFile, writing_into
from torchloom.errors import DataError, Problem

_CHUNK_SIZE = 1 << 20
IN_FOLDER = "found in it"


@dataclass
class Origins:
    """Where the files of one data folder came from, said in one line for the run's log."""

    folder: Path
    created: bool = False  # the folder did not exist: preparing the data created it
    files: dict[str, list[str]] = field(default_factory=dict)  # how -> file names

    def add(self, how: str, name: str) -> None:
        names = self.files.setdefault(how, [])
        if name not in names:
            names.append(name)

    def describe(self) -> str:
        """E.g. "data folder ~/data/mnist (created now): a.gz, b.gz copied from the packaged
        copy in /usr/share/x"."""
        created = " (created now)" if self.created else ""
        parts = [f"{', '.join(names)} {how}" for how, names in self.files.items()]
        return f"data folder {self.folder}{created}: {'; '.join(parts) or 'nothing read'}"


# Digests of the files this process has read, by path and what `stat` says of the file: a
# search checks the same data files for every trial (MNIST's, 56 ms a run). A file written
# since has another modification time (or size), one replaced another inode: read again.
# As git does, a file modified in the last seconds is not remembered: a second write within
# the clock's tick would leave its modification time as it was.
_DIGESTS: dict[tuple[str, int, int, int, int], str] = {}
_SETTLED_NS = 2_000_000_000


def md5_of(path: str | Path) -> str:
    """The hex md5 digest of a file, read in chunks so large archives do not fill memory."""
    stat = os.stat(path)
    key = (str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_dev)
    if key in _DIGESTS:
        return _DIGESTS[key]
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(_CHUNK_SIZE), b""):
            digest.update(chunk)
    hexdigest = digest.hexdigest()
    if time.time_ns() - stat.st_mtime_ns > _SETTLED_NS:
        _DIGESTS[key] = hexdigest
    return hexdigest


def packaged_copy(package: str, relative_dir: str) -> Path | None:
    """The folder `relative_dir` inside an installed package, or None if it is not installed.

    Only the top-level package is looked up, and `find_spec` of a top-level name does not
    import it: data packages often import heavy things (pandas, matplotlib) we do not need.
    A dotted `package` is treated as a path below the top-level package for the same reason.
    """
    top, *below = package.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        folder = Path(location).joinpath(*below, relative_dir)
        if folder.is_dir():
            return folder
    return None


def check_md5(path: Path, expected: str, what: str = "") -> None:
    """Raise a `DataError` naming `path` and both md5s unless the file's md5 is `expected`;
    `what` says what the checksum is of, when a file may have more than one."""
    actual = md5_of(path)
    if actual != expected:
        of = f" ({what})" if what else ""
        raise DataError.at(
            str(path),
            f"file '{path.name}'",
            f"has md5 {actual}, expected {expected}{of}; it is left untouched",
            "delete it (it is fetched again) or replace it with the original",
        )


def write_verified(source: BinaryIO, dest: Path, md5: str) -> str | None:
    """Copy a stream into `dest` atomically if its md5 is `md5`; else return the actual md5.

    The stream may be a file, a download or a decompressing reader (`gzipped_files`). A read
    error of the stream propagates as it is; failing to write `dest` is a `FolderNotWritable`.
    """
    digest = hashlib.md5(usedforsecurity=False)
    pending = PendingFile(dest, data_folder=True)
    try:
        for chunk in iter(lambda: source.read(_CHUNK_SIZE), b""):
            digest.update(chunk)
            with writing_into(dest):
                pending.handle.write(chunk)
    except BaseException:
        pending.discard()
        raise
    actual = digest.hexdigest()
    if actual != md5:
        pending.discard()
        return actual
    pending.commit()
    return None


def create_folder(folder: Path) -> bool:
    """Create the data folder and its parents; True when it did not exist (so that a failed
    attempt can remove it again), a `DataError` when it cannot be created."""
    existed = folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a file in the way, no permission, a read-only disk
        problem = Problem(str(folder), "data folder", f"cannot be created: {error}")
        raise DataError([problem]) from error
    return not existed


def download(url_list: Sequence[str], dest: str | Path, md5: str, timeout: float = 60.0) -> str:
    """Download one file to `dest`, trying each URL in turn until one gives the right md5;
    the URL that gave it.

    Raises a `DataError` listing every URL tried and why it failed, or `FolderNotWritable`
    when `dest` cannot be written (not the mirrors' fault: the next one is not tried).
    """
    dest = Path(dest)
    failures: list[str] = []
    for url in url_list:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                actual = write_verified(response, dest, md5)
        # URLError, HTTPError and timeouts are OSErrors; a cut connection is an HTTPException.
        except (OSError, ValueError, http.client.HTTPException) as error:
            failures.append(f"{url}: {error}")
            continue
        if actual is None:
            return url
        failures.append(f"{url}: md5 {actual}, expected {md5}")
    tried = "; ".join(failures) if failures else "no URL given"
    raise DataError.at(str(dest), "download", f"failed from every mirror: {tried}")


def _copy_verified(source: Path, dest: Path, md5: str) -> bool:
    with open(source, "rb") as file:
        return write_verified(file, dest, md5) is None


def copied_from(source: Path) -> str:
    """How a file copied from the packaged copy in `source` came, for `Origins`."""
    return f"copied from the packaged copy in {source}"


def ensure_files(
    folder: str | Path,
    files: Mapping[str, str],
    packaged: Sequence[Path],
    mirrors: Sequence[str],
    allow_download: bool,
    layout_hint: str,
    timeout: float = 60.0,
    origins: Origins | None = None,
) -> Path:
    """Return `folder` once every file of `files` ({name: md5}) is in it and verified.

    packaged:       folders holding byte-identical copies (see `packaged_copy`); used first
                    because they need no network (and even when downloading is not allowed).
    mirrors:        base URLs; a file's URL is the mirror followed by its name.
    allow_download: whether the mirrors may be used at all.
    layout_hint:    what the folder should hold, in words, for the error when files are missing.
    origins:        receives where each file came from.
    """
    folder = Path(folder)
    origins = origins if origins is not None else Origins(folder)
    # Check everything already there before writing anything: a wrong file is reported as is.
    missing = []
    for name, md5 in files.items():
        path = folder / name
        if not path.exists():
            missing.append(name)
            continue
        check_md5(path, md5)
        origins.add(IN_FOLDER, name)
    if not missing:
        return folder

    created_folder = create_folder(folder)
    origins.created = origins.created or created_folder
    try:
        still_missing, problems = _fetch(
            folder, missing, files, packaged, mirrors if allow_download else (), timeout, origins
        )
    finally:
        if created_folder and not any(folder.iterdir()):
            folder.rmdir()  # leave no trace of a failed attempt
    if not still_missing:
        return folder

    not_packaged = (
        f"; the packaged copies in {', '.join(str(p) for p in packaged)} lack them or differ"
        if packaged
        else ""
    )
    where_to_get = ", ".join(mirrors) if mirrors else "the dataset's publisher"
    or_download = "" if allow_download or not mirrors else ", or allow downloading"
    problems.append(
        Problem(
            str(folder),
            "data folder",
            f"missing {', '.join(still_missing)}; it should hold {layout_hint}{not_packaged}",
            f"get the files from {where_to_get} and put them in {folder}{or_download}",
        )
    )
    raise DataError(problems)


def _fetch(
    folder: Path,
    missing: Sequence[str],
    files: Mapping[str, str],
    packaged: Sequence[Path],
    mirrors: Sequence[str],
    timeout: float,
    origins: Origins,
) -> tuple[list[str], list[Problem]]:
    """Copy or download the missing files into `folder`: those still missing, and why."""
    problems: list[Problem] = []
    still_missing = []
    can_download = bool(mirrors)
    for name in missing:
        md5 = files[name]
        source = next(
            (
                source
                for source in packaged
                if (source / name).is_file() and _copy_verified(source / name, folder / name, md5)
            ),
            None,
        )
        if source is not None:
            origins.add(copied_from(source), name)
            continue
        if can_download:
            try:
                url = download([mirror + name for mirror in mirrors], folder / name, md5, timeout)
                origins.add(f"downloaded from {url.removesuffix(name)}", name)
                continue
            except FolderNotWritable:
                raise  # the folder's fault, not the mirrors'
            except DataError as error:
                problems.extend(error.problems)
                # Offline or blocked mirrors fail the same way for every file: waiting for
                # each one to time out would only delay the error.
                can_download = False
        still_missing.append(name)
    return still_missing, problems
