"""The CIFAR-10 and CIFAR-100 "python version" files: locating, extracting and reading them.

A data folder holds the extracted batches (`cifar-10-batches-py/` or `cifar-100-python/`, as
`tar xzf` leaves them) or the archive they come in, which is then checked against its md5 and
extracted; a missing archive is downloaded (checked too) when allowed. The batches are Python
pickles: a dict with b"data" (uint8 [count, 3072], the red, green and blue 32x32 planes of
every image) and the labels (b"labels" for CIFAR-10, b"fine_labels" and b"coarse_labels" for
CIFAR-100); the meta file holds the class names.
"""

from __future__ import annotations

import codecs
import importlib
import pickle
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchloom.data.atomic_files import atomic_file, writing_into
from torchloom.data.sources import IN_FOLDER, Origins, ensure_files
from torchloom.errors import DataError, Problem

IMAGE_SIZE = 32
_PIXELS = 3 * IMAGE_SIZE * IMAGE_SIZE


@dataclass(frozen=True)
class CifarRelease:
    name: str  # "CIFAR-10"
    archive: str  # the .tar.gz as published
    archive_md5: str
    folder: str  # the folder the archive extracts to
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    meta_file: str
    url: str = "https://www.cs.toronto.edu/~kriz/"

    @property
    def files(self) -> tuple[str, ...]:
        return (*self.train_files, *self.test_files, self.meta_file)

    def layout(self) -> str:
        return (
            f"the extracted {self.name} python batches "
            f"({self.folder}/{{{', '.join(self.files)}}}) or the archive {self.archive} "
            f"(md5 {self.archive_md5})"
        )


CIFAR10 = CifarRelease(
    name="CIFAR-10",
    archive="cifar-10-python.tar.gz",
    archive_md5="c58f30108f718f92721af3b95e74349a",
    folder="cifar-10-batches-py",
    train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
    test_files=("test_batch",),
    meta_file="batches.meta",
)
CIFAR100 = CifarRelease(
    name="CIFAR-100",
    archive="cifar-100-python.tar.gz",
    archive_md5="eb9058c3a382ffc7106e4002c42a8d85",
    folder="cifar-100-python",
    train_files=("train",),
    test_files=("test",),
    meta_file="meta",
)


def locate_batches(
    data_folder: Path,
    release: CifarRelease,
    allow_download: bool,
    timeout: float = 60.0,
    origins: Origins | None = None,
) -> Path:
    """The folder holding every extracted file of `release`, extracting the archive (found in
    `data_folder`, or downloaded into it) when some are missing; `origins` receives how."""
    origins = origins if origins is not None else Origins(data_folder)
    batches = data_folder / release.folder
    missing = [name for name in release.files if not (batches / name).is_file()]
    if not missing:
        origins.add(IN_FOLDER, f"{release.folder}/")
        return batches
    absent = (
        f"{release.folder}/ is absent"
        if not batches.exists()
        else f"{release.folder}/ lacks {', '.join(missing)}"
    )
    # Checks the md5 of an archive already there (never overwriting a wrong one), or downloads
    # and checks it; otherwise the error names the folder and the expected layout.
    ensure_files(
        data_folder,
        {release.archive: release.archive_md5},
        packaged=[],
        mirrors=[release.url],
        allow_download=allow_download,
        layout_hint=f"{release.layout()}; {absent}",
        timeout=timeout,
        origins=origins,
    )
    _extract(data_folder / release.archive, data_folder, release)
    origins.add(f"extracted from {release.archive}", f"{release.folder}/")
    return batches


def _extract(archive: Path, data_folder: Path, release: CifarRelease) -> None:
    """Extract the release's files, and nothing else, from its verified archive.

    Only members whose names are exactly the expected ones are written, to paths built from
    those names, so a crafted member name cannot write outside the data folder. Each file goes
    to a temporary name first, so an interrupted extraction leaves no half file.
    """
    wanted = {f"{release.folder}/{name}" for name in release.files}
    with writing_into(data_folder / release.folder):
        (data_folder / release.folder).mkdir(parents=True, exist_ok=True)
    written = set()
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                if member.name not in wanted or not member.isfile():
                    continue
                source = tar.extractfile(member)
                if source is None:
                    continue
                dest = data_folder / member.name
                with atomic_file(dest, data_folder=True) as out:
                    while chunk := source.read(1 << 20):
                        with writing_into(dest):
                            out.write(chunk)
                written.add(member.name)
    except (OSError, EOFError, tarfile.TarError) as error:
        raise DataError.at(
            str(archive), f"{release.name} archive", f"cannot be extracted: {error}"
        ) from error
    if written != wanted:
        lacking = ", ".join(sorted(wanted - written))
        raise DataError.at(str(archive), f"{release.name} archive", f"does not contain {lacking}")


# What the batches may reference: numpy arrays and dtypes (and codecs.encode, which turns a
# string into bytes), nothing that runs code.
def _multiarray() -> Any:
    try:
        return importlib.import_module("numpy._core.multiarray")  # numpy 2
    except ImportError:  # numpy 1
        return importlib.import_module("numpy.core.multiarray")


def _numeric() -> Any:
    try:
        return importlib.import_module("numpy._core.numeric")
    except ImportError:
        return importlib.import_module("numpy.core.numeric")


_ALLOWED_GLOBALS = {
    "_reconstruct": lambda: _multiarray()._reconstruct,
    "scalar": lambda: _multiarray().scalar,
    "_frombuffer": lambda: _numeric()._frombuffer,
    "ndarray": lambda: np.ndarray,
    "dtype": lambda: np.dtype,
}
_NUMPY_MODULES = {
    "numpy",
    "numpy.core.multiarray",
    "numpy._core.multiarray",
    "numpy.core.numeric",
    "numpy._core.numeric",
}


class _NumpyOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module in _NUMPY_MODULES and name in _ALLOWED_GLOBALS:
            return _ALLOWED_GLOBALS[name]()
        if (module, name) == ("_codecs", "encode"):  # how protocol 2 writes Python 3 bytes
            return codecs.encode
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: not a numpy array")


def read_pickle(path: Path) -> dict[bytes, Any]:
    """One CIFAR batch or meta file, as the dict it pickles (bytes keys)."""
    # Pickle is the only form CIFAR's python version comes in. This reads only files whose
    # archive was checked against its md5, or that the user put in the data folder; on top of
    # that the unpickler refuses every global but numpy's array constructors, so a tampered
    # file cannot run code. encoding="bytes" reads Python 2 strings as bytes (b"data", ...).
    try:
        with open(path, "rb") as file:
            loaded = _NumpyOnlyUnpickler(file, encoding="bytes").load()
    except (OSError, EOFError, ValueError, TypeError, pickle.UnpicklingError) as error:
        raise _malformed(path, f"cannot be read as a CIFAR pickle: {error}") from error
    if not isinstance(loaded, dict):
        raise _malformed(path, f"holds a {type(loaded).__name__}, expected a dict")
    return loaded


def _malformed(path: Path, message: str) -> DataError:
    return DataError(
        [
            Problem(
                str(path),
                "CIFAR file",
                message,
                "delete the extracted folder so that it is extracted again from the archive",
            )
        ]
    )


def _entry(batch: dict[bytes, Any], key: bytes, path: Path) -> Any:
    if key not in batch:
        keys = ", ".join(repr(k) for k in batch)
        raise _malformed(path, f"has no {key!r} entry (it has {keys})")
    return batch[key]


def read_batches(
    folder: Path, names: Sequence[str], label_key: bytes, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Images [count, 3, 32, 32] uint8 and labels [count] int64 of the batches, in order."""
    images, labels = [], []
    for name in names:
        path = folder / name
        batch = read_pickle(path)
        data = np.asarray(_entry(batch, b"data", path))
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != _PIXELS:
            raise _malformed(
                path,
                f"b'data' must be uint8 [count, {_PIXELS}], found {data.dtype} {list(data.shape)}",
            )
        batch_labels = np.asarray(_entry(batch, label_key, path))
        if batch_labels.shape != (data.shape[0],) or batch_labels.dtype.kind not in "iu":
            raise _malformed(
                path,
                f"{label_key!r} must hold one class index per image ({data.shape[0]}), "
                f"found {batch_labels.dtype} {list(batch_labels.shape)}",
            )
        if batch_labels.size and not (batch_labels.min() >= 0 and batch_labels.max() < num_classes):
            raise _malformed(
                path,
                f"{label_key!r} must be class indices 0 to {num_classes - 1}, found "
                f"{batch_labels.min()} to {batch_labels.max()}",
            )
        images.append(torch.from_numpy(data.reshape(-1, 3, IMAGE_SIZE, IMAGE_SIZE)))
        labels.append(torch.from_numpy(batch_labels.astype(np.int64)))
    return torch.cat(images), torch.cat(labels)


def read_label_names(path: Path, key: bytes) -> list[str]:
    names = _entry(read_pickle(path), key, path)
    if not isinstance(names, list) or not all(isinstance(n, (bytes, str)) for n in names):
        raise _malformed(path, f"{key!r} must be a list of class names")
    return [n.decode() if isinstance(n, bytes) else n for n in names]
