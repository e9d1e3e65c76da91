"""CIFAR10 and CIFAR100 on tiny batches written in the real python-pickle format: splits,
labels, the archive path (checked and extracted), the errors, augmentation under a seed."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from cifar_fixtures import PER_BATCH, TEST_SIZE, dump, images, write_cifar10
from held_batches import check_batches_held_on_devices
from torchloom.data import cifar_files
from torchloom.data.atomic_files import FolderNotWritable
from torchloom.data.sources import md5_of
from torchloom.errors import ComponentError, DataError
from torchloom.zoo import image_transforms
from torchloom.zoo.tasks.cifar import (
    CIFAR10,
    CIFAR100,
    CIFAR100_COARSE_CLASSES,
    CIFAR100_FINE_CLASSES,
)


def write_cifar100(folder: Path) -> Path:
    batches = folder / "cifar-100-python"
    batches.mkdir(parents=True)
    for name, count, seed in [("train", 10, 1), ("test", TEST_SIZE, 2)]:
        fine = np.arange(count) * 7 % 100
        dump(
            batches / name,
            {
                b"data": images(count, seed),
                b"fine_labels": list(fine),
                b"coarse_labels": list(fine % 20),
            },
        )
    dump(
        batches / "meta",
        {
            b"fine_label_names": [n.encode() for n in CIFAR100_FINE_CLASSES],
            b"coarse_label_names": [n.encode() for n in CIFAR100_COARSE_CLASSES],
        },
    )
    return batches


@pytest.fixture(scope="module")
def cifar10_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("cifar10")
    write_cifar10(folder)
    return str(folder)


def test_cifar10_splits_pixels_and_labels(cifar10_folder: str) -> None:
    common = {"data_folder": cifar10_folder, "validation_size": 4, "normalize": False}
    train = CIFAR10.create(**common)
    validation = CIFAR10.create(split="validation", **common)
    test = CIFAR10.create(split="test", **common)
    assert (len(train), len(validation), len(test)) == (26, 4, TEST_SIZE)
    # Sample 7 of the training set is image 1 of data_batch_2; the validation set is the end
    # of data_batch_5.
    expected = torch.from_numpy(images(PER_BATCH, 2)[1].reshape(3, 32, 32)).float() / 255
    assert torch.allclose(train[7]["inputs"], expected)
    assert train[7]["targets"] == 3 and train[7]["labels"] == "cat"
    last = torch.from_numpy(images(PER_BATCH, 5)[-1].reshape(3, 32, 32)).float() / 255
    assert torch.allclose(validation[-1]["inputs"], last)
    assert test.sample_targets().tolist() == list(range(8))
    assert [test[i]["labels"] for i in (0, 1)] == ["airplane", "automobile"]


def test_cifar10_normalisation_globals_and_batches(cifar10_folder: str) -> None:
    task = CIFAR10.create(data_folder=cifar10_folder, split="test")
    raw = CIFAR10.create(data_folder=cifar10_folder, split="test", normalize=False)
    mean = torch.tensor([0.4914, 0.4822, 0.4465])[:, None, None]
    std = torch.tensor([0.2470, 0.2435, 0.2616])[:, None, None]
    assert torch.allclose(task[2]["inputs"], (raw[2]["inputs"] - mean) / std, atol=1e-5)
    assert task.global_value("num_classes") == 10
    assert task.global_value("label_word_mappings")["truck"] == 9
    loader = torch.utils.data.DataLoader(task, batch_size=5, collate_fn=task.collate)
    batch = next(iter(loader))
    assert batch["inputs"].shape == (5, 3, 32, 32) and batch["targets"].dtype == torch.int64
    assert task.output_specs()["inputs"].shape_text() == "[batch, 3, 32, 32]"


def test_cifar100_fine_and_coarse_labels(tmp_path: Path) -> None:
    write_cifar100(tmp_path)
    fine = CIFAR100.create(data_folder=str(tmp_path), validation_size=2)
    coarse = CIFAR100.create(data_folder=str(tmp_path), validation_size=2, fine_labels=False)
    assert len(fine) == len(coarse) == 8
    assert fine[3]["targets"] == 21 and fine[3]["labels"] == "chimpanzee"
    assert coarse[3]["targets"] == 1 and coarse[3]["labels"] == "fish"
    assert fine.dimension_sizes() == {"classes": 100}
    assert coarse.global_value("num_classes") == 20


def test_the_archive_is_checked_extracted_and_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "source"
    batches = write_cifar10(source)
    folder = tmp_path / "data"
    folder.mkdir()
    archive = folder / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(batches, arcname="cifar-10-batches-py")
        extra = b"should not be extracted"
        info = tarfile.TarInfo("../outside")
        info.size = len(extra)
        tar.addfile(info, io.BytesIO(extra))
    release = dataclasses.replace(cifar_files.CIFAR10, archive_md5=md5_of(archive))
    monkeypatch.setattr(CIFAR10, "RELEASE", release)

    task = CIFAR10.create(data_folder=str(folder), split="test", download=False)
    assert len(task) == TEST_SIZE
    assert task.build_notes == [
        f"CIFAR-10 test split from data folder {folder}: cifar-10-python.tar.gz found in it; "
        "cifar-10-batches-py/ extracted from cifar-10-python.tar.gz"
    ]
    extracted = sorted(p.name for p in (folder / "cifar-10-batches-py").iterdir())
    assert extracted == sorted(release.files)
    assert not (tmp_path / "outside").exists()
    os.remove(archive)  # the extracted folder is used as it is from now on
    again = CIFAR10.create(data_folder=str(folder), split="test", download=False)
    assert len(again) == 8
    assert again.build_notes == [
        f"CIFAR-10 test split from data folder {folder}: cifar-10-batches-py/ found in it"
    ]


def test_an_extraction_the_folder_cannot_hold_blames_the_folder_not_the_archive(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    file_size_limit: Callable[[int], contextlib.AbstractContextManager[None]],
) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    archive = folder / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(write_cifar10(tmp_path / "source"), arcname="cifar-10-batches-py")
    release = dataclasses.replace(cifar_files.CIFAR10, archive_md5=md5_of(archive))
    monkeypatch.setattr(CIFAR10, "RELEASE", release)

    with pytest.raises(FolderNotWritable) as error, file_size_limit(8192):  # batches: 18 KB
        CIFAR10.create(data_folder=str(folder), split="test", download=False).prepare()

    assert f"{folder / 'cifar-10-batches-py'}: data folder: cannot be written (File too large)" in (
        str(error.value)
    )
    assert "archive" not in str(error.value)
    # Files small enough were extracted whole; nothing else is there (no .part, no half file).
    for path in (folder / "cifar-10-batches-py").iterdir():
        assert (
            path.read_bytes()
            == (tmp_path / "source" / "cifar-10-batches-py" / path.name).read_bytes()
        )


def test_a_wrong_archive_is_reported_and_left_untouched(tmp_path: Path) -> None:
    archive = tmp_path / "cifar-10-python.tar.gz"
    archive.write_bytes(b"half a download")
    with pytest.raises(DataError) as error:
        CIFAR10.create(data_folder=str(tmp_path), download=False).prepare()
    assert "c58f30108f718f92721af3b95e74349a" in str(error.value)
    assert archive.read_bytes() == b"half a download"


def test_missing_data_names_the_folder_and_the_layout(tmp_path: Path) -> None:
    folder = tmp_path / "cifar100"
    with pytest.raises(DataError) as error:
        CIFAR100.create(data_folder=str(folder), download=False).prepare()
    message = str(error.value)
    assert str(folder) in message
    assert "cifar-100-python/{train, test, meta}" in message
    assert "cifar-100-python.tar.gz" in message and "https://www.cs.toronto.edu/~kriz/" in message


def test_a_pickle_that_would_run_code_is_refused(tmp_path: Path) -> None:
    batches = write_cifar10(tmp_path)

    class Exploit:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, ("echo pwned",))

    dump(batches / "test_batch", {b"data": Exploit(), b"labels": []})  # type: ignore[dict-item]
    with pytest.raises(DataError, match="refusing to load"):
        CIFAR10.create(data_folder=str(tmp_path), split="test").prepare()


def test_malformed_batches_and_meta_are_data_errors(tmp_path: Path) -> None:
    batches = write_cifar10(tmp_path)
    dump(batches / "test_batch", {b"data": images(3, 0)[:, :100], b"labels": [0, 1, 2]})
    with pytest.raises(DataError, match=r"uint8 \[count, 3072\]"):
        CIFAR10.create(data_folder=str(tmp_path), split="test").prepare()
    dump(batches / "test_batch", {b"data": images(3, 0), b"labels": [0, 1, 10]})
    with pytest.raises(DataError, match="class indices 0 to 9"):
        CIFAR10.create(data_folder=str(tmp_path), split="test").prepare()
    dump(batches / "batches.meta", {b"label_names": [b"cat", b"dog"]})
    with pytest.raises(DataError, match=r"batches\.meta"):
        CIFAR10.create(data_folder=str(tmp_path), split="test").prepare()


def test_build_errors() -> None:
    with pytest.raises(ComponentError, match="validation_size"):
        CIFAR10.create(split="validation", validation_size=0)
    with pytest.raises(ValidationError, match="less than the 50000 training images"):
        CIFAR10.create(validation_size=50_000)
    with pytest.raises(ComponentError, match="larger than the 32x32 images"):
        CIFAR10.create(transforms={"random_crop": {"size": [40, 40]}})


def test_augmentation_is_reproducible_and_flip_one_flips(cifar10_folder: str) -> None:
    augment = {"random_crop": {"size": [32, 32], "padding": 4}, "horizontal_flip": 0.5}
    first = CIFAR10.create(data_folder=cifar10_folder, split="test", transforms=augment)
    second = CIFAR10.create(data_folder=cifar10_folder, split="test", transforms=augment)
    torch.manual_seed(3)
    a = torch.stack([first[i]["inputs"] for i in range(TEST_SIZE)])
    torch.manual_seed(3)
    b = torch.stack([second[i]["inputs"] for i in range(TEST_SIZE)])
    assert torch.equal(a, b)
    assert not torch.equal(a, torch.stack([second[i]["inputs"] for i in range(TEST_SIZE)]))

    plain = CIFAR10.create(data_folder=cifar10_folder, split="test")
    flipped = CIFAR10.create(
        data_folder=cifar10_folder, split="test", transforms={"horizontal_flip": 1.0}
    )
    assert torch.equal(flipped[4]["inputs"], plain[4]["inputs"].flip(-1))


# Held as uint8 and converted when fetched; normalised and resized ahead; random steps after.
FETCH_SETTINGS = {
    "uint8": {"normalize": False},  # uint8 kept: each batch converted when fetched
    "normalized": {},  # the task's normalisation, precomputed
    "resized": {"normalize": False, "transforms": {"resize": [20, 20]}},
    "augmented": {  # random steps after the precomputed ones, normalisation and cutout among them
        "transforms": {
            "random_crop": {"size": [32, 32], "padding": 4},
            "horizontal_flip": 0.5,
            "cutout": 8,
        }
    },
}


@pytest.mark.parametrize("settings", list(FETCH_SETTINGS.values()), ids=list(FETCH_SETTINGS))
def test_a_fetched_batch_is_the_samples_collated(
    cifar10_folder: str, settings: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loaders' path (`fetch`, one gather, no sample built one by one) gives the batch the
    samples one by one give, random draws included, and leaves torch's generator where they
    leave it."""
    task = CIFAR10.create(data_folder=cifar10_folder, split="test", **settings)
    indices = [5, 0, -1, 5, 2]
    torch.manual_seed(11)
    by_sample = task.collate([task[i] for i in indices])
    after_samples = torch.rand(3)

    def one_by_one(self: CIFAR10, index: int) -> None:
        raise AssertionError("fetch built a sample one by one")

    monkeypatch.setattr(CIFAR10, "__getitem__", one_by_one)
    torch.manual_seed(11)
    fetched = task.fetch(indices)
    assert torch.equal(torch.rand(3), after_samples)
    assert set(fetched) == set(by_sample)
    for key, value in by_sample.items():
        if isinstance(value, torch.Tensor):
            assert fetched[key].dtype == value.dtype, key
            assert torch.equal(fetched[key], value), key
        else:
            assert fetched[key] == value, key
    assert fetched["indices"].tolist() == [5, 0, TEST_SIZE - 1, 5, 2]
    with pytest.raises(IndexError, match="out of range"):
        task.fetch([0, TEST_SIZE])


@pytest.mark.parametrize("transforms", [{}, {"resize": [20, 20], "horizontal_flip": 0.5}])
def test_a_set_kept_as_uint8_gets_the_deterministic_steps_in_every_batch(
    cifar10_folder: str, transforms: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A set too large to keep as floats is kept as uint8, and each batch (or sample) is then
    resized and normalised on its own, however large: the size limit is the whole set's."""
    torch.manual_seed(0)
    floats = CIFAR10.create(data_folder=cifar10_folder, split="test", transforms=transforms)
    expected = floats.fetch(range(TEST_SIZE))["inputs"]
    monkeypatch.setattr(image_transforms, "PRECOMPUTE_LIMIT_BYTES", 0)
    kept = CIFAR10.create(data_folder=cifar10_folder, split="test", transforms=transforms)
    kept.prepare()
    assert kept._images is not None and kept._images.dtype == torch.uint8
    torch.manual_seed(0)
    assert torch.allclose(kept.fetch(range(TEST_SIZE))["inputs"], expected, atol=1e-6)
    if not transforms:  # no draws: one sample alone is the batch's
        assert torch.equal(kept[3]["inputs"], expected[3])


@pytest.mark.parametrize("settings", list(FETCH_SETTINGS.values()), ids=list(FETCH_SETTINGS))
def test_a_task_held_on_a_device_gathers_its_batches_there(
    cifar10_folder: str, settings: dict[str, Any]
) -> None:
    """`hold_on` (`dataloader.on_device`) gives the host's batches, gathered on the device."""
    check_batches_held_on_devices(
        lambda: CIFAR10.create(data_folder=cifar10_folder, split="test", **settings),
        [5, 0, -1, 5, 2],
    )


def test_a_loader_s_augmentation_is_the_same_whoever_reads_the_sample(
    cifar10_folder: str,
) -> None:
    """A loader's random crops and flips drew from the global generator of whichever process
    read the batch: a loader with workers (each seeded its own way), each process of a
    multi-process run, or one without workers drew other numbers, so an augmented run changed
    with them. They are keyed by (seed, epoch, position in the epoch's order) now: the same
    batches with 0 or 2 workers, split between 2 processes, or resumed mid-epoch; another
    epoch draws anew."""
    from torchloom.config.schema import SectionConfig
    from torchloom.engine.loaders import SectionLoader

    augment = {"random_crop": {"size": [32, 32], "padding": 4}, "horizontal_flip": 0.5}
    task = CIFAR10.create(data_folder=cifar10_folder, split="test", transforms=augment)

    def batches(
        workers: int = 0, rank: int = 0, world: int = 1, epoch: int = 0, start: int = 0
    ) -> list[torch.Tensor]:
        dataloader = {"batch_size": 4, "shuffle": epoch == 0, "num_workers": workers}
        section = SectionConfig.model_validate({"task": {}, "dataloader": dataloader})
        loader = SectionLoader("training", task, section, 5, lambda *k: "", rank=rank, world=world)
        try:
            torch.manual_seed(rank + workers)  # whatever the global generator holds
            return [b["inputs"] for b in loader.epoch(epoch, start)]
        finally:
            loader.close()

    alone = batches()
    assert all(torch.equal(a, b) for a, b in zip(alone, batches(workers=2), strict=True))
    halves = zip(batches(rank=0, world=2), batches(rank=1, world=2), strict=True)
    assert all(torch.equal(a, torch.cat(h)) for a, h in zip(alone, halves, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(alone[1:], batches(start=1), strict=True))
    # Epochs 2 and 3 unshuffled (shuffle: epoch == 0): the same samples, drawn anew.
    assert not torch.equal(torch.cat(batches(epoch=2)), torch.cat(batches(epoch=3)))
    plain = CIFAR10.create(data_folder=cifar10_folder, split="test")  # nothing to draw
    section = SectionConfig.model_validate({"task": {}, "dataloader": {"batch_size": 4}})
    assert SectionLoader("training", plain, section, 5, lambda *k: "").keyed is None


def test_keyed_draws_survive_a_resume_at_an_epoch_s_end_with_persistent_workers(
    cifar10_folder: str,
) -> None:
    """A loader resumed at its epoch's end has nothing left: its keyed sampler had length 0,
    was taken for false, and the plain sampler went in its place, so every draw was 0 and,
    with persistent workers, every later epoch's images all got the same crop and flip. And a
    sample a sampler with replacement draws twice in an epoch is augmented twice."""
    from torchloom.config.schema import SectionConfig
    from torchloom.engine.loaders import SectionLoader

    augment = {"random_crop": {"size": [32, 32], "padding": 4}, "horizontal_flip": 0.5}
    task = CIFAR10.create(data_folder=cifar10_folder, split="test", transforms=augment)
    loader_settings = {"batch_size": 4, "num_workers": 1, "persistent_workers": True}
    section = SectionConfig.model_validate({"task": {}, "dataloader": loader_settings})
    resumed = SectionLoader("training", task, section, 5, lambda *k: "")
    fresh = SectionLoader("training", task, section, 5, lambda *k: "")
    try:
        assert list(resumed.epoch(0, resumed.batches_per_epoch())) == []  # at the end
        after = [b["inputs"] for b in resumed.epoch(1)]
        expected = [b["inputs"] for b in fresh.epoch(1)]
        assert all(torch.equal(a, b) for a, b in zip(after, expected, strict=True))
    finally:
        resumed.close()
        fresh.close()
    weighted = {"type": "weighted", "weights": [1.0] * TEST_SIZE, "num_samples": 64}
    section = SectionConfig.model_validate(
        {"task": {}, "sampler": weighted, "dataloader": {"batch_size": 64}}
    )
    loader = SectionLoader("training", task, section, 5, lambda *k: "")
    (batch,) = list(loader.epoch(0))
    loader.close()
    twice = [
        (i, j) for i in range(64) for j in range(i) if batch["indices"][i] == batch["indices"][j]
    ]
    assert twice and any(not torch.equal(batch["inputs"][i], batch["inputs"][j]) for i, j in twice)


def test_a_subclass_whose_fetch_takes_no_draws_is_not_handed_any(cifar10_folder: str) -> None:
    augment = {"horizontal_flip": 0.5}

    class OwnFetch(CIFAR10):
        def fetch(self, indices: Any) -> Any:  # an extension's, written before draws=
            return super().fetch(indices)

    assert CIFAR10.create(data_folder=cifar10_folder, transforms=augment).keyed_draws
    assert not OwnFetch.create(data_folder=cifar10_folder, transforms=augment).keyed_draws
