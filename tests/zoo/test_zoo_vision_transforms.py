"""The `transforms:` of image tasks: order, sizes, reproducibility under torch's seed, the
precomputed and the per-sample paths agreeing, and the build errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest
import torch

from torchloom.config import load_config
from torchloom.errors import ComponentError
from torchloom.zoo import image_transforms
from torchloom.zoo.image_transforms import ImageTransforms, Normalization, build_image_transformer


def transformer(
    depth: int = 3, size: int = 8, normalization: Normalization | None = None, **transforms: object
) -> image_transforms.ImageTransformer:
    return build_image_transformer(
        ImageTransforms.model_validate(transforms),
        depth,
        size,
        size,
        normalization,
        subject="component 'task' (Test)",
        where="test.yml:3",
    )


@pytest.fixture
def images() -> torch.Tensor:
    return torch.randint(0, 256, (6, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator())


def test_no_transforms_give_floats_in_0_1(images: torch.Tensor) -> None:
    steps = transformer()
    kept = steps.precompute(images)
    assert kept.dtype == torch.uint8  # converting each sample is cheaper than 4x the memory
    assert torch.allclose(steps(kept[2]), images[2].float() / 255)
    assert (steps.height, steps.width) == (8, 8)


def test_flip_probability_one_flips_every_image(images: torch.Tensor) -> None:
    steps = transformer(horizontal_flip=1.0)
    kept = steps.precompute(images)
    for index in range(len(images)):
        assert torch.allclose(steps(kept[index]), images[index].flip(-1).float() / 255)


def test_random_steps_are_reproducible_under_torch_s_seed(images: torch.Tensor) -> None:
    settings = {"random_crop": {"size": [8, 8], "padding": 2}, "horizontal_flip": 0.5}
    first, second = transformer(**settings), transformer(**settings)
    kept_first, kept_second = first.precompute(images), second.precompute(images)

    def epoch(steps: image_transforms.ImageTransformer, kept: torch.Tensor) -> torch.Tensor:
        return torch.stack([steps(kept[i]) for i in range(len(kept))])

    torch.manual_seed(7)
    a = epoch(first, kept_first)
    torch.manual_seed(7)
    b = epoch(second, kept_second)
    c = epoch(second, kept_second)  # the generator has moved on: other crops and flips
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


# (transforms, the bounds of each image's draws in order: crop top, crop left, flip, cutout)
BATCHED = {
    "crop, flip, normalise, cut": (
        {"random_crop": {"size": [7, 6], "padding": 2}, "horizontal_flip": 0.5, "cutout": 3},
        {"top": 6, "left": 7, "flip": 0, "row": 7, "column": 6},
    ),
    "columns only, always flipped": (
        {"random_crop": {"size": [8, 5]}, "horizontal_flip": 1.0},
        {"left": 4},
    ),
    "an even cutout alone": ({"cutout": 4}, {"row": 8, "column": 8}),
}


@pytest.mark.parametrize("settings, bounds", list(BATCHED.values()), ids=list(BATCHED))
def test_a_batch_s_random_steps_are_each_image_s_own(
    settings: dict[str, Any], bounds: dict[str, int]
) -> None:
    """Cropped, flipped, normalised and cut out as one batch, each image is what torchvision's
    functional steps make of it alone with the numbers it drew: one row of torch.rand per
    image, a value per draw in order, scaled to its bound (a flip: below its chance). A crop
    that keeps a side whole draws nothing for it, and a flip of probability 1 nothing."""
    from torchvision.transforms.v2 import functional as F

    mean, std = [0.4, 0.5, 0.6], [0.2, 0.3, 0.25]
    steps = transformer(normalization=Normalization(mean=mean, std=std), **settings)
    images = torch.rand(40, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(3)
    batch = steps.random_steps(images)
    after = torch.rand(2)
    torch.manual_seed(3)
    drawn = torch.rand(len(images), len(bounds)).double()
    assert torch.equal(torch.rand(2), after)  # those draws, no more
    crop, chance, side = (settings.get(key) for key in ("random_crop", "horizontal_flip", "cutout"))
    flips = set()
    for image, numbers, out in zip(images, drawn, batch, strict=True):
        scaled = (numbers * torch.tensor(list(bounds.values()))).long().tolist()
        at = dict(zip(bounds, scaled, strict=True))
        expected = image
        if crop is not None:
            expected = F.pad(expected, [crop.get("padding", 0)])
            expected = F.crop(expected, at.get("top", 0), at.get("left", 0), *crop["size"])
        flip = chance == 1.0 or (
            "flip" in at and float(numbers[list(bounds).index("flip")]) < chance
        )
        flips.add(flip)
        if flip:
            expected = F.horizontal_flip(expected)
        expected = F.normalize(expected, mean, std)
        if side is not None:  # a square centred on the drawn pixel, clipped at the borders
            top, left = at["row"] - side // 2, at["column"] - side // 2
            expected[:, max(top, 0) : top + side, max(left, 0) : left + side] = 0
        assert torch.equal(out, expected)
    assert flips == ({True, False} if "flip" in bounds else {chance == 1.0})
    # One image alone draws its own row: a batch is its samples, one after the other.
    torch.manual_seed(3)
    assert torch.equal(torch.stack([steps(image) for image in images]), batch)


def test_steps_first_taken_in_an_evaluation_pass_serve_training_too() -> None:
    """What the steps make once per device (the mean and std, position ranges) is made the
    first time they run, which may be under torch.inference_mode (validation): such tensors
    could not be saved for a backward pass later."""
    steps = transformer(
        normalization=Normalization(mean=[0.5], std=[0.25]), random_crop={"size": [6, 6]}
    )
    images = torch.rand(4, 3, 8, 8)
    with torch.inference_mode():
        steps.random_steps(images)
    steps.random_steps(images.clone().requires_grad_()).sum().backward()


def test_padding_is_black_before_normalisation() -> None:
    normalization = Normalization(mean=[0.5], std=[0.25])
    steps = transformer(
        depth=1, size=4, normalization=normalization, random_crop={"size": [6, 6], "padding": 1}
    )
    white = torch.full((1, 1, 4, 4), 255, dtype=torch.uint8)
    sample = steps(steps.precompute(white)[0])
    assert sample.shape == (1, 6, 6)
    assert float(sample[0, 0, 0]) == (0 - 0.5) / 0.25  # a padded pixel: black, normalised
    assert float(sample[0, 2, 2]) == (1 - 0.5) / 0.25


def test_resize_then_crop_set_the_output_size() -> None:
    steps = transformer(resize=[16, 12], random_crop={"size": [10, 10]})
    assert (steps.height, steps.width) == (10, 10)
    image = torch.zeros(3, 8, 8, dtype=torch.uint8)
    assert steps(steps.precompute(image[None])[0]).shape == (3, 10, 10)


def test_a_set_too_large_to_precompute_is_transformed_per_sample(
    images: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    normalization = Normalization(mean=[0.4, 0.5, 0.6], std=[0.2, 0.3, 0.25])
    precomputed = transformer(normalization=normalization, resize=[5, 5])
    expected = precomputed.precompute(images)
    assert expected.dtype == torch.float32 and expected.shape == (6, 3, 5, 5)
    monkeypatch.setattr(image_transforms, "PRECOMPUTE_LIMIT_BYTES", 0)
    per_sample = transformer(normalization=normalization, resize=[5, 5])
    kept = per_sample.precompute(images)
    assert kept.dtype == torch.uint8
    for index in range(len(images)):
        assert torch.allclose(per_sample(kept[index]), expected[index], atol=1e-6)


def test_build_errors_name_the_component_and_every_problem() -> None:
    with pytest.raises(ComponentError) as error:
        transformer(
            depth=3,
            normalization=Normalization(mean=[0.5], std=[0.5]),
            normalize={"mean": [0.1, 0.2], "std": [0.3, 0.4]},
            random_crop={"size": [20, 20], "padding": 2},
        )
    message = str(error.value)
    assert "2 problems" not in message  # three of them
    assert "3 problems" in message and "test.yml:3" in message and "'task'" in message
    assert "normalize: false" in message
    assert "2 means and stds for images of 3 channel(s)" in message
    assert "20x20 is larger than the 12x12 images" in message


def test_schema_rejects_unknown_keys_and_bad_values() -> None:
    with pytest.raises(pydantic.ValidationError):
        ImageTransforms.model_validate({"horizontal_flip": 1.5})
    with pytest.raises(pydantic.ValidationError):
        ImageTransforms.model_validate({"random_crop": {"size": [8, 8], "pading": 2}})
    with pytest.raises(pydantic.ValidationError, match="mean has 2 values but std has 1"):
        ImageTransforms.model_validate({"normalize": {"mean": [0.1, 0.2], "std": [0.3]}})


def test_cutout_zeroes_a_square_after_normalisation() -> None:
    """The square is cut from the normalised image (zero there, not black before it), of the
    side asked for when it fits, smaller where it meets a border, at a seeded position."""
    images = torch.full((1, 1, 16, 16), 255, dtype=torch.uint8)
    steps = transformer(
        depth=1, size=16, normalization=Normalization(mean=[0.5], std=[0.5]), cutout=4
    )
    kept = steps.precompute(images)
    assert kept.dtype == torch.uint8  # a random step: the conversion runs per sample
    seen = set()
    for seed in range(40):
        torch.manual_seed(seed)
        out = steps(kept[0])
        zero = out[0] == 0
        assert set(out[0][~zero].tolist()) == {1.0}  # (1 - 0.5) / 0.5 elsewhere
        rows, columns = zero.any(1).nonzero().flatten(), zero.any(0).nonzero().flatten()
        height, width = len(rows), len(columns)
        assert int(zero.sum()) == height * width  # one rectangle
        assert 1 <= height <= 4 and 1 <= width <= 4
        inside = rows[0] >= 2 and rows[-1] <= 13 and columns[0] >= 2 and columns[-1] <= 13
        if inside:
            assert (height, width) == (4, 4)
        seen.add((int(rows[0]), int(columns[0])))
        torch.manual_seed(seed)
        assert torch.equal(steps(kept[0]), out)  # reproducible under torch's seed
    assert len(seen) > 20  # the position varies
    assert torch.equal(kept[0], images[0])  # the kept image is never modified


def test_cutout_is_part_of_a_task_s_config(tmp_path: Path) -> None:
    config = tmp_path / "cutout.yml"
    config.write_text(
        "default_configs: [loom://fashion_mnist/lenet5.yml]\n"
        "training:\n  task: {transforms: {horizontal_flip: 0.5, cutout: 8}}\n",
        encoding="utf-8",
    )
    loaded = load_config(config)
    assert loaded.data["training"]["task"]["transforms"]["cutout"] == 8
    with pytest.raises(pydantic.ValidationError, match="greater than 0"):
        ImageTransforms.model_validate({"cutout": 0})


@pytest.mark.parametrize("section", ["validation", "test"])
def test_random_steps_in_an_evaluation_task_are_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], section: str
) -> None:
    """A validation task copied from the training task (`task: ${training.task}`) took its
    random crop too, and loom check accepted it: the statistics of every validation pass
    were those of another random set."""
    from torchloom.cli.main import main

    config = tmp_path / "copied.yml"
    config.write_text(
        "default_configs: [loom://mnist/lenet5.yml]\n"
        "training:\n  task: {transforms: {random_crop: {size: [28, 28], padding: 2},"
        " horizontal_flip: 0.5}}\n"
        f"{section}:\n  task: ${{training.task}}\n",
        encoding="utf-8",
    )
    capsys.readouterr()
    assert main(["check", str(config)]) == 2
    message = capsys.readouterr().err
    assert f"component '{section}.task'" in message and "Traceback" not in message
    assert "transforms.random_crop" in message and "transforms.horizontal_flip" in message
    assert "its own task" in message
    config.write_text(config.read_text().replace(f"{section}:\n  task: ${{training.task}}\n", ""))
    assert main(["check", str(config)]) == 0
