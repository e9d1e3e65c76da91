"""FashionMNIST on tiny IDX files in the real format (no download, no Debian package needed),
and the gzipped-file rules it relies on: published .gz, decompressed copies, packaged copies
that were re-compressed."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from torchloom.data.gzipped_files import GzippedFile
from torchloom.data.idx import read_idx_images
from torchloom.errors import ComponentError, DataError
from torchloom.zoo.tasks import fashion_mnist
from torchloom.zoo.tasks.fashion_mnist import FASHION_MNIST, FashionMNIST

TRAIN_SIZE, TEST_SIZE = 30, 12


def idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(size).to_bytes(4, "big") for size in array.shape
    )
    return header + array.astype(np.uint8).tobytes()


def md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


@dataclasses.dataclass
class Fixture:
    published: Path  # the four files as "published": gzip with a name and a time in the header
    files: tuple[GzippedFile, ...]
    images: dict[str, np.ndarray]  # prefix -> images
    labels: dict[str, np.ndarray]


@pytest.fixture(scope="module")
def fixture_files(tmp_path_factory: pytest.TempPathFactory) -> Fixture:
    rng = np.random.default_rng(0)
    folder = tmp_path_factory.mktemp("published")
    files, images, labels = [], {}, {}
    for prefix, count in [("train", TRAIN_SIZE), ("t10k", TEST_SIZE)]:
        images[prefix] = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
        labels[prefix] = np.arange(count, dtype=np.uint8) % 10
        for kind, array in [("images-idx3", images[prefix]), ("labels-idx1", labels[prefix])]:
            name = f"{prefix}-{kind}-ubyte.gz"
            content = idx_bytes(array)
            compressed = gzip.compress(content, mtime=1234567890)
            (folder / name).write_bytes(compressed)
            files.append(GzippedFile(name, md5(compressed), md5(content)))
    return Fixture(folder, tuple(files), images, labels)


@pytest.fixture
def dataset(fixture_files: Fixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Fixture:
    """FashionMNIST described with the fixture's checksums, no packaged copy, no mirror that
    answers (the download path must not be taken)."""
    described = dataclasses.replace(
        FASHION_MNIST,
        files=fixture_files.files,
        packaged_folders=(),
        mirrors=("http://127.0.0.1:9/",),
    )
    monkeypatch.setattr(FashionMNIST, "DATASET", described)
    return fixture_files


@pytest.fixture
def data_folder(dataset: Fixture, tmp_path: Path) -> str:
    folder = tmp_path / "fashion"
    shutil.copytree(dataset.published, folder)
    return str(folder)


def test_splits_images_labels_and_class_names(dataset: Fixture, data_folder: str) -> None:
    train = FashionMNIST.create(data_folder=data_folder, validation_size=10, normalize=False)
    validation = FashionMNIST.create(
        data_folder=data_folder, split="validation", validation_size=10, normalize=False
    )
    test = FashionMNIST.create(data_folder=data_folder, split="test", normalize=False)
    assert (len(train), len(validation), len(test)) == (20, 10, TEST_SIZE)
    for task, index, prefix, file_index in [
        (train, 19, "train", 19),
        (validation, 0, "train", 20),
        (test, 3, "t10k", 3),
    ]:
        sample = task[index]
        expected = torch.from_numpy(dataset.images[prefix][file_index]).float() / 255
        assert torch.allclose(sample["inputs"][0], expected)
        assert sample["targets"] == file_index % 10
        assert sample["labels"] == FASHION_MNIST.class_names[file_index % 10]
    assert test[9]["labels"] == "Ankle boot"
    assert train.sample_targets().tolist() == [i % 10 for i in range(20)]


def test_globals_specs_and_batches(data_folder: str) -> None:
    task = FashionMNIST.create(data_folder=data_folder, split="test", resize=[32, 32])
    assert task.global_value("label_word_mappings")["T-shirt/top"] == 0
    assert task.global_value("num_classes") == 10
    assert task.global_value("input_height") == 32
    assert task.dimension_sizes() == {"classes": 10}
    loader = torch.utils.data.DataLoader(task, batch_size=5, collate_fn=task.collate)
    batch = next(iter(loader))
    assert batch["inputs"].shape == (5, 1, 32, 32)
    assert batch["inputs"].dtype == torch.float32
    assert batch["labels"][:2] == ["T-shirt/top", "Trouser"]
    assert task.output_specs()["inputs"].shape_text() == "[batch, 1, 32, 32]"


def test_normalisation_uses_the_fashion_statistics(data_folder: str) -> None:
    raw = FashionMNIST.create(data_folder=data_folder, split="test", normalize=False)
    standardised = FashionMNIST.create(data_folder=data_folder, split="test")
    expected = (raw[0]["inputs"] - FASHION_MNIST.pixel_mean) / FASHION_MNIST.pixel_std
    assert torch.allclose(standardised[0]["inputs"], expected, atol=1e-6)


def test_init_reads_no_data(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_data(*args: object, **kwargs: object) -> None:
        raise AssertionError("building the task must not touch the data")

    monkeypatch.setattr(fashion_mnist.IdxImageClassification, "_load", no_data)
    task = FashionMNIST.create(data_folder="/no/such/folder", split="validation")
    assert task.global_value("input_depth") == 1
    with pytest.raises(AssertionError, match="must not touch"):
        len(task)


def test_only_the_split_s_files_are_needed_and_subset_clips(
    dataset: Fixture, tmp_path: Path
) -> None:
    folder = tmp_path / "only_test"
    folder.mkdir()
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(dataset.published / name, folder)
    task = FashionMNIST.create(data_folder=str(folder), split="test", subset=5, download=False)
    assert len(task) == 5
    with pytest.raises(IndexError):
        task[5]


def test_decompressed_files_in_the_data_folder_are_accepted(
    dataset: Fixture, tmp_path: Path
) -> None:
    folder = tmp_path / "gunzipped"
    folder.mkdir()
    for file in dataset.files:
        (folder / file.decompressed_name).write_bytes(
            gzip.decompress((dataset.published / file.name).read_bytes())
        )
    task = FashionMNIST.create(data_folder=str(folder), split="test", download=False)
    assert len(task) == TEST_SIZE


def test_a_recompressed_packaged_copy_is_verified_by_content(
    dataset: Fixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    debian = tmp_path / "debian"
    debian.mkdir()
    for file in dataset.files:  # as Debian ships them: other gzip headers, other md5s
        content = gzip.decompress((dataset.published / file.name).read_bytes())
        (debian / file.name).write_bytes(gzip.compress(content, mtime=0))
    monkeypatch.setattr(
        FashionMNIST,
        "DATASET",
        dataclasses.replace(FashionMNIST.DATASET, packaged_folders=(str(debian),)),
    )
    folder = tmp_path / "data"
    task = FashionMNIST.create(data_folder=str(folder), split="test", download=False)
    assert len(task) == TEST_SIZE
    assert sorted(p.name for p in folder.iterdir()) == [
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ]
    names = "t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte"
    assert task.build_notes == [
        f"Fashion-MNIST test split from data folder {folder} (created now): {names} "
        f"decompressed from the packaged copy in {debian}"
    ]
    again = FashionMNIST.create(data_folder=str(folder), split="test", download=False)
    assert torch.equal(again[3]["inputs"], task[3]["inputs"])
    assert again.build_notes == [
        f"Fashion-MNIST test split from data folder {folder}: {names} found in it"
    ]


def test_a_wrong_file_is_reported_and_left_untouched(dataset: Fixture, tmp_path: Path) -> None:
    folder = tmp_path / "wrong"
    folder.mkdir()
    (folder / "t10k-labels-idx1-ubyte").write_bytes(b"not the labels")
    shutil.copy(dataset.published / "t10k-images-idx3-ubyte.gz", folder)
    with pytest.raises(DataError) as error:
        FashionMNIST.create(data_folder=str(folder), split="test").prepare()
    assert "t10k-labels-idx1-ubyte" in str(error.value)
    assert "decompressed content" in str(error.value)
    assert (folder / "t10k-labels-idx1-ubyte").read_bytes() == b"not the labels"


def test_missing_files_name_the_folder_the_files_and_the_debian_package(
    dataset: Fixture, tmp_path: Path
) -> None:
    folder = tmp_path / "empty"
    with pytest.raises(DataError) as error:
        FashionMNIST.create(data_folder=str(folder), download=False).prepare()
    message = str(error.value)
    assert str(folder) in message
    assert "train-images-idx3-ubyte.gz" in message and "train-labels-idx1-ubyte.gz" in message
    assert "dataset-fashion-mnist" in message
    assert not folder.exists()


def test_validation_size_beyond_the_file_is_a_data_error(data_folder: str) -> None:
    with pytest.raises(DataError, match="validation_size 5000 leaves no training images"):
        FashionMNIST.create(data_folder=data_folder).prepare()


def test_build_errors() -> None:
    with pytest.raises(ComponentError, match="validation_size"):
        FashionMNIST.create(split="validation", validation_size=0)
    with pytest.raises(ComponentError, match=r"transforms\.resize"):
        FashionMNIST.create(resize=[32, 32], transforms={"resize": [32, 32]})
    with pytest.raises(ComponentError, match="normalize: false"):
        FashionMNIST.create(transforms={"normalize": {"mean": [0.5], "std": [0.5]}})


@pytest.mark.skipif(
    not Path(fashion_mnist.DEBIAN_FASHION_MNIST, "t10k-images-idx3-ubyte.gz").is_file(),
    reason="Debian's dataset-fashion-mnist is not installed (make test installs it as root)",
)
def test_the_debian_package_is_a_packaged_copy(tmp_path: Path) -> None:
    task = FashionMNIST.create(data_folder=str(tmp_path / "fm"), split="test", download=False)
    assert len(task) == 10_000
    assert task[0]["labels"] == "Ankle boot"  # the first test image of Fashion-MNIST
    images = read_idx_images(tmp_path / "fm" / "t10k-images-idx3-ubyte")
    assert images.shape == (10_000, 28, 28)
