"""ImageFolder on a handful of tiny PNG and JPEG files written by PIL: classes, seeded splits
that never overlap, sizes and channels, and the errors that name the culprit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydantic
import pytest
import torch
from PIL import Image

from torchloom.config.schema import SectionConfig
from torchloom.engine.loaders import SectionLoader
from torchloom.errors import ComponentError, ConfigError, DataError
from torchloom.zoo.tasks.image_folder import ImageFolder

COUNTS = {"cat": 10, "dog": 10, "bird": 5}


def write_image(path: Path, value: int, size: tuple[int, int] = (6, 8)) -> None:
    pixels = np.full((size[0], size[1], 3), value, dtype=np.uint8)
    pixels[:, 0] = (value + 100) % 256  # a distinct left column, to see flips and resizes
    Image.fromarray(pixels).save(path)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("images")
    for class_index, (name, count) in enumerate(COUNTS.items()):
        (root / name).mkdir()
        for i in range(count):
            suffix = ".jpg" if name == "bird" else ".png"
            write_image(root / name / f"{i:02d}{suffix}", 20 * class_index + i)
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / ".hidden").mkdir()
    return root


def create(folder: Path, **params: object) -> ImageFolder:
    task = ImageFolder.create(data_folder=str(folder), image_size=[4, 5], **params)
    assert isinstance(task, ImageFolder)
    return task


def test_classes_are_the_sorted_sub_folders(folder: Path) -> None:
    task = create(folder)
    assert task.global_value("label_word_mappings") == {"bird": 0, "cat": 1, "dog": 2}
    assert task.dimension_sizes() == {"classes": 3}
    assert len(task) == 25
    assert sorted(task.sample_targets().tolist()) == [0] * 5 + [1] * 10 + [2] * 10
    sample = task[0]
    assert sample["labels"] == ["bird", "cat", "dog"][sample["targets"]]
    assert sample["inputs"].shape == (3, 4, 5) and sample["inputs"].dtype == torch.float32
    assert float(sample["inputs"].min()) >= 0.0 and float(sample["inputs"].max()) <= 1.0


def test_splits_are_seeded_disjoint_and_stratified(folder: Path) -> None:
    fractions = {"validation_fraction": 0.2, "test_fraction": 0.2}
    splits = {s: create(folder, split=s, **fractions) for s in ("train", "validation", "test")}
    for task in splits.values():
        task.prepare()
    files = {s: set(task._files) for s, task in splits.items()}
    assert [len(files[s]) for s in ("train", "validation", "test")] == [15, 5, 5]
    assert not (files["train"] & files["validation"] or files["train"] & files["test"])
    assert not files["validation"] & files["test"]
    assert sorted(splits["test"].sample_targets().tolist()) == [0, 1, 1, 2, 2]
    again = create(folder, split="test", **fractions)
    again.prepare()
    assert again._files == splits["test"]._files
    other_seed = create(folder, split="test", split_seed=1, **fractions)
    other_seed.prepare()
    assert set(other_seed._files) != files["test"]


def test_grayscale_subset_given_classes_and_transforms(folder: Path) -> None:
    task = create(
        folder,
        grayscale=True,
        classes=["dog", "cat"],
        subset=4,
        transforms={"horizontal_flip": 1.0, "normalize": {"mean": [0.5], "std": [0.5]}},
    )
    assert task.global_value("input_depth") == 1
    assert task.global_value("label_word_mappings") == {"dog": 0, "cat": 1}
    assert len(task) == 4
    batch = task.collate([task[i] for i in range(4)])
    assert batch["inputs"].shape == (4, 1, 4, 5)
    assert set(batch["labels"]) <= {"dog", "cat"}
    plain = create(folder, grayscale=True, classes=["dog", "cat"], subset=4)
    expected = (plain[1]["inputs"].flip(-1) - 0.5) / 0.5
    assert torch.allclose(task[1]["inputs"], expected)


def test_missing_or_empty_folders_are_data_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        ImageFolder.create(data_folder=str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match="no class sub-folders"):
        ImageFolder.create(data_folder=str(tmp_path))
    (tmp_path / "empty_class").mkdir()
    (tmp_path / "empty_class" / "readme.md").write_text("no images here")
    task = ImageFolder.create(data_folder=str(tmp_path))  # listing the classes is fine...
    with pytest.raises(DataError, match="class 'empty_class' has no images") as error:
        task.prepare()  # ...reading them is not
    assert str(tmp_path / "empty_class") in str(error.value)
    with pytest.raises(DataError, match="class 'ghost' has no folder"):
        ImageFolder.create(data_folder=str(tmp_path), classes=["ghost"]).prepare()


def test_an_unreadable_image_is_named(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    broken = tmp_path / "a" / "broken.png"
    broken.write_bytes(b"\x89PNG not really")
    task = ImageFolder.create(data_folder=str(tmp_path), image_size=[4, 4])
    with pytest.raises(DataError) as error:
        task[0]
    assert str(broken) in str(error.value)
    assert "cannot be read as an image" in str(error.value)


def test_build_errors() -> None:
    with pytest.raises(ComponentError, match="validation_fraction is 0"):
        ImageFolder.create(data_folder="/x", classes=["a"], split="validation")
    with pytest.raises(pydantic.ValidationError, match="must be below 1"):
        ImageFolder.create(
            data_folder="/x", classes=["a"], validation_fraction=0.5, test_fraction=0.5
        )


def test_images_read_from_files_cannot_be_gathered_on_a_device(folder: Path) -> None:
    """`dataloader.on_device` needs a split held as a tensor: files read one by one are a
    ConfigError naming the section's key, not a slow path taken in silence."""
    task = create(folder)
    assert not task.hold_on(torch.device("cpu"))
    section = SectionConfig.model_validate({"task": {}, "dataloader": {"on_device": True}})
    with pytest.raises(ConfigError, match=r"the task \(ImageFolder\) builds its samples") as error:
        SectionLoader("training", task, section, 0, lambda *keys: "run.yml:" + ".".join(keys))
    assert "run.yml:training.dataloader.on_device" in str(error.value)
    assert "remove on_device" in str(error.value)


def test_a_fetched_batch_of_files_is_the_samples_collated(folder: Path) -> None:
    """Images read from files are read one by one and transformed as one batch: the batch the
    samples give, random draws included, and torch's generator left where they leave it."""
    augment = {"random_crop": {"size": [4, 4], "padding": 1}, "horizontal_flip": 0.5}
    task = create(
        folder, transforms={**augment, "cutout": 2, "normalize": {"mean": [0.5], "std": [0.2]}}
    )
    indices = [3, 0, -1, 3, 7, 12]
    torch.manual_seed(5)
    by_sample = task.collate([task[i] for i in indices])
    after_samples = torch.rand(3)
    torch.manual_seed(5)
    fetched = task.fetch(indices)
    assert torch.equal(torch.rand(3), after_samples)
    assert torch.equal(fetched["inputs"], by_sample["inputs"])
    assert torch.equal(fetched["indices"], by_sample["indices"])
    assert torch.equal(fetched["targets"], by_sample["targets"])
    assert fetched["labels"] == by_sample["labels"]
    assert fetched["indices"].tolist() == [3, 0, 24, 3, 7, 12]


def test_a_16_bit_image_keeps_its_shades(tmp_path: Path) -> None:
    """PIL's convert('L') clips a 16-bit picture (mode I;16) to 0 or 255: a 16-bit scan was
    read as black and white."""
    import numpy as np
    from PIL import Image

    folder = tmp_path / "scans" / "a"
    folder.mkdir(parents=True)
    ramp = (np.arange(16, dtype=np.uint16).reshape(4, 4) * 4369).astype(np.uint16)  # 0..65535
    Image.fromarray(ramp).save(folder / "ramp.png")  # mode I;16
    task = ImageFolder.create(
        data_folder=str(tmp_path / "scans"), image_size=[4, 4], grayscale=True
    )
    task.prepare()
    pixels = task.fetch([0])["inputs"][0, 0]
    assert len(pixels.unique()) == 16
    assert (float(pixels.min()), float(pixels.max())) == (0.0, 1.0)


def test_a_wide_image_is_made_8_bit_exactly_in_a_few_bytes_a_pixel() -> None:
    """int64 and a copy per operation took 17 bytes a pixel: 3 GB for a 360 KB 16-bit PNG of
    13000 x 13000 pixels, the size PIL's decompression-bomb limit lets through."""
    import tracemalloc

    from torchloom.data.image_modes import eight_bit

    every = np.arange(65536, dtype=np.uint16)
    exact = (every.astype(np.int64) * 255 + 32767) // 65535  # 65535 is 255, rounded
    assert np.array_equal(
        np.asarray(eight_bit(Image.fromarray(every.reshape(256, 256)))).ravel(), exact
    )
    signed = np.array([[-5, 0, 300, 70000]], dtype=np.int32)  # mode I: clipped to 16 bits
    assert np.asarray(eight_bit(Image.fromarray(signed))).tolist() == [[0, 0, 1, 255]]
    big = Image.fromarray(np.full((2000, 2000), 40000, dtype=np.uint16))
    tracemalloc.start()
    try:
        eight_bit(big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2000 * 2000, peak


def test_classes_are_plain_folder_names_inside_the_data_folder(tmp_path: Path) -> None:
    """`classes: ["../../etc"]` read images from outside the data folder (a config is
    untrusted input, and the images go into the run's reports)."""
    from torchloom.zoo.tasks.image_folder import ImageFolder

    with pytest.raises(pydantic.ValidationError, match="plain file name inside its folder"):
        ImageFolder.create(data_folder=str(tmp_path), classes=["../../etc", "cats"])


def test_a_deployment_resizes_as_the_task_read_its_files(tmp_path: Path) -> None:
    """image_size [16, 16] with a transforms resize to [32, 32]: the task resizes each file
    twice, the sidecar recorded the last size alone, and `loom predict` resized 96x96 files
    once, straight to 32x32 (pixels up to 0.08 off what the model was trained on)."""
    from torchloom.deploy.image_recipe import image_tensor
    from torchloom.deploy.sidecar import _image_preprocessing

    rows = np.linspace(0, 255, 96)[:, None] * np.linspace(0.2, 1.0, 96)[None, :]
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        for i in range(2):
            pixels = np.stack([rows, rows.T, 255 - rows], axis=-1) * (0.5 + 0.2 * i)
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(
                tmp_path / name / f"{i}.png"
            )
    task = ImageFolder.create(
        data_folder=str(tmp_path), image_size=[16, 16], transforms={"resize": [32, 32]}
    )
    assert isinstance(task, ImageFolder)
    recipe = _image_preprocessing(task)
    assert recipe is not None and recipe["resizes"] == [[16, 16], [32, 32]]
    for index in range(len(task)):
        trained = task[index]["inputs"].numpy()
        given = image_tensor(task._files[index], recipe)[0]
        assert given.shape == trained.shape == (3, 32, 32)
        # PIL's resize against torchvision's for the second step: within about a grey level
        # (resized once, these images were 0.024 off).
        assert float(np.abs(given - trained).max()) < 0.01
