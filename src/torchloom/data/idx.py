"""Readers for IDX files, the format of MNIST, Fashion-MNIST, KMNIST and EMNIST.

An IDX file is a 4-byte magic number (two zero bytes, an element-type code, the number of
dimensions), one big-endian uint32 size per dimension, then the elements in C order. Files may
be gzip-compressed; that is detected from the content, not the file name, so a decompressed
copy named `.gz` (or the reverse) still reads. Anything that does not add up is a `DataError`
naming the file and what was expected, never a numpy or torch exception.
"""

from __future__ import annotations

import gzip
import math
import zlib
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch

from torchloom.errors import DataError, Problem

# Element-type codes of the IDX format, as big-endian numpy types.
_IDX_TYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_GZIP_MAGIC = b"\x1f\x8b"


def _malformed(path: Path, message: str) -> DataError:
    return DataError(
        [
            Problem(
                str(path),
                "IDX file",
                message,
                "delete the file so that it is fetched again, or replace it with the original",
            )
        ]
    )


# Decompressed IDX files kept in this process, newest last, up to a total size: a run reads
# MNIST's training file twice (its training and validation splits), and a search worker reads
# the same files for every trial; decompressing the 9.9 MB of train-images takes a third of a
# second. Keyed by path, size and modification time, so a replaced file is read again.
_DECOMPRESSED: OrderedDict[tuple[str, int, int], bytes] = OrderedDict()
DECOMPRESSED_CACHE_BYTES = 256 * 2**20


def _read_bytes(path: Path) -> bytes:
    try:
        stat = path.stat()
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        if key in _DECOMPRESSED:
            _DECOMPRESSED.move_to_end(key)
            return _DECOMPRESSED[key]
        raw = path.read_bytes()
    except OSError as error:
        raise DataError.at(str(path), "IDX file", f"cannot be read: {error}") from error
    if not raw.startswith(_GZIP_MAGIC):
        return raw
    try:
        data = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as error:  # truncated or corrupted gzip stream
        raise _malformed(path, f"is not a valid gzip stream: {error}") from error
    if len(data) <= DECOMPRESSED_CACHE_BYTES:
        _DECOMPRESSED[key] = data
        while sum(map(len, _DECOMPRESSED.values())) > DECOMPRESSED_CACHE_BYTES:
            _DECOMPRESSED.popitem(last=False)
    return data


def read_idx(path: str | Path) -> np.ndarray:
    """Read any IDX file (raw or gzip) into a numpy array of its own element type and shape."""
    array = _idx_view(Path(path))
    # Native byte order (torch cannot hold big-endian data) and a writable copy of our own.
    return array.astype(array.dtype.newbyteorder("="))


def _idx_view(path: Path) -> np.ndarray:
    """The file's elements, checked against its header, as a read-only view of its bytes:
    nothing is copied, so a caller can copy only the part it keeps."""
    data = _read_bytes(path)
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise _malformed(
            path, f"expected the IDX magic number 0x0000TTNN, found {data[:4].hex() or 'nothing'}"
        )
    type_code, ndim = data[2], data[3]
    if type_code not in _IDX_TYPES:
        known = ", ".join(f"0x{code:02X}" for code in _IDX_TYPES)
        raise _malformed(path, f"unknown element-type code 0x{type_code:02X}, expected {known}")
    if ndim == 0:
        raise _malformed(path, "declares 0 dimensions, expected at least 1")
    header_size = 4 + 4 * ndim
    if len(data) < header_size:
        raise _malformed(
            path, f"header declares {ndim} dimensions but the file ends after {len(data)} bytes"
        )
    shape = tuple(int(s) for s in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    element_type = _IDX_TYPES[type_code]
    expected = math.prod(shape) * element_type.itemsize
    actual = len(data) - header_size
    if actual != expected:
        raise _malformed(
            path,
            f"shape {list(shape)} of {element_type.name} needs {expected} bytes of data, "
            f"found {actual}",
        )
    return np.frombuffer(data, dtype=element_type, offset=header_size).reshape(shape)


def _check_ndim(path: Path, array: np.ndarray, ndim: int, what: str) -> None:
    if array.ndim != ndim:
        raise _malformed(
            path, f"expected {what} ({ndim} dimensions), found shape {list(array.shape)}"
        )


def idx_images_view(path: str | Path) -> np.ndarray:
    """Images [count, height, width] of unsigned bytes, checked, as a read-only view of the
    file's bytes: nothing is copied, so a caller copies only the rows it keeps (a subset of
    MNIST's 47 MB of training images is a fraction of that) and reads the file once."""
    path = Path(path)
    array = _idx_view(path)
    _check_ndim(path, array, 3, "images [count, height, width]")
    if array.dtype != np.uint8:
        raise _malformed(path, f"expected unsigned-byte images, found {array.dtype.name}")
    return array


def read_idx_images(path: str | Path, rows: slice | None = None) -> torch.Tensor:
    """Images [count, height, width] as uint8 (`rows`: only those), a copy of their own."""
    view = idx_images_view(path)
    return torch.from_numpy(view[rows if rows is not None else slice(None)].copy())


def read_idx_labels(path: str | Path) -> torch.Tensor:
    """Labels [count] as int64 (the dtype losses and metrics take as class indices)."""
    path = Path(path)
    array = read_idx(path)
    _check_ndim(path, array, 1, "labels [count]")
    if array.dtype.kind not in "iu":
        raise _malformed(path, f"expected integer labels, found {array.dtype.name}")
    return torch.from_numpy(array.astype(np.int64))
