"""Data files published gzip-compressed, accepted compressed or decompressed.

`sources.ensure_files` wants byte-identical copies. Files published as `.gz` often reach a
machine re-compressed or decompressed: Debian's build normalises gzip headers (the
`dataset-fashion-mnist` package ships Fashion-MNIST with other md5s than the publisher's), and
users `gunzip` their downloads. The content is what matters, so a file here has two
checksums: `md5` of the `.gz` as published, and `content_md5` of what it decompresses to.

In the data folder, `NAME.gz` must match `md5` and a decompressed `NAME` must match
`content_md5`. A packaged copy is taken byte for byte when it matches `md5`, and otherwise
decompressed into the data folder when its content matches `content_md5`. Whatever is still
missing goes to `ensure_files` (download from the mirrors, or the error naming the layout).
The readers of such files (`data.idx`) detect gzip from the content, so both forms read alike.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, cast

from torchloom.data.sources import (
    IN_FOLDER,
    Origins,
    check_md5,
    copied_from,
    create_folder,
    ensure_files,
    write_verified,
)


@dataclass(frozen=True)
class GzippedFile:
    name: str  # as published, ending in .gz
    md5: str  # of the published .gz
    content_md5: str  # of the decompressed content

    @property
    def decompressed_name(self) -> str:
        return self.name.removesuffix(".gz")


def _in_folder(folder: Path, file: GzippedFile) -> Path | None:
    """The verified copy of `file` already in `folder`, or None when there is none."""
    compressed, decompressed = folder / file.name, folder / file.decompressed_name
    if compressed.exists():
        check_md5(compressed, file.md5, "the file as published")
        return compressed
    if decompressed.exists():
        check_md5(decompressed, file.content_md5, f"the decompressed content of {file.name}")
        return decompressed
    return None


def _write_from(source: Path, dest: Path, md5: str, decompress: bool) -> bool:
    """Whether `source` (decompressed) has md5 `md5` and is now copied to `dest`. Failing to
    write `dest` is a `FolderNotWritable` (a `DataError`, which this does not catch)."""
    try:
        with open(source, "rb") as raw:
            stream = gzip.GzipFile(fileobj=raw) if decompress else raw
            return write_verified(cast(BinaryIO, stream), dest, md5) is None
    except (OSError, EOFError, zlib.error):  # unreadable, or a corrupted gzip stream
        return False


def _copy_packaged(
    folder: Path, file: GzippedFile, packaged: Sequence[Path]
) -> tuple[Path, str] | None:
    """The copy of `file` written into `folder` from a packaged copy, and how it came."""
    for source in packaged:
        compressed, decompressed = source / file.name, source / file.decompressed_name
        if compressed.is_file():
            if _write_from(compressed, folder / file.name, file.md5, decompress=False):
                return folder / file.name, copied_from(source)
            dest = folder / file.decompressed_name
            if _write_from(compressed, dest, file.content_md5, decompress=True):
                return dest, f"decompressed from the packaged copy in {source}"
        if decompressed.is_file():
            dest = folder / file.decompressed_name
            if _write_from(decompressed, dest, file.content_md5, decompress=False):
                return dest, copied_from(source)
    return None


def ensure_gzipped_files(
    folder: str | Path,
    files: Sequence[GzippedFile],
    packaged: Sequence[Path],
    mirrors: Sequence[str],
    allow_download: bool,
    layout_hint: str,
    timeout: float = 60.0,
    origins: Origins | None = None,
) -> dict[str, Path]:
    """A verified copy in `folder` of every file, by published name (`NAME.gz` -> its path).

    Arguments as for `sources.ensure_files`; `packaged` folders may hold the files
    re-compressed or decompressed.
    """
    folder = Path(folder)
    origins = origins if origins is not None else Origins(folder)
    found: dict[str, Path] = {}
    for file in files:  # check everything already there before writing anything
        path = _in_folder(folder, file)
        if path is not None:
            found[file.name] = path
            origins.add(IN_FOLDER, path.name)
    missing = [file for file in files if file.name not in found]
    existing_sources = [p for p in packaged if p.is_dir()]
    if missing and existing_sources:
        created_folder = create_folder(folder)
        origins.created = origins.created or created_folder
        try:
            for file in missing:
                copied = _copy_packaged(folder, file, existing_sources)
                if copied is not None:
                    found[file.name] = copied[0]
                    origins.add(copied[1], copied[0].name)
        finally:
            if created_folder and not any(folder.iterdir()):
                folder.rmdir()  # leave no trace of a failed attempt
    missing = [file for file in missing if file.name not in found]
    if missing:
        hint = layout_hint
        if existing_sources:
            listed = ", ".join(str(p) for p in existing_sources)
            hint += f"; the packaged copies in {listed} lack them or differ"
        ensure_files(
            folder,
            {file.name: file.md5 for file in missing},
            packaged=[],
            mirrors=mirrors,
            allow_download=allow_download,
            layout_hint=hint,
            timeout=timeout,
            origins=origins,
        )
        found.update({file.name: folder / file.name for file in missing})
    return found
