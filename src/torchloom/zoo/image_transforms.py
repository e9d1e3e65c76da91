"""Image transforms in config: the `transforms:` parameter every image task accepts.

```yaml
training:
  task:
    type: CIFAR10
    transforms: {random_crop: {size: [32, 32], padding: 4}, horizontal_flip: 0.5}
```

The steps always run in one order: pixels to floats in [0, 1] -> `resize` -> `random_crop` ->
`horizontal_flip` -> normalisation (the task's own `normalize`, or `transforms.normalize`) ->
`cutout`.
The deterministic steps before the first random one are computed once when the data is
loaded (when the result fits in memory and they do more than convert to floats), the others
per sample. Random steps draw from
torch's global generator, which the engine seeds (and DataLoader workers derive their seeds
from), so augmented epochs are reproducible. Augmentation happens only where a config asks for
it: put random steps in the training task, not in validation or test.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import torch
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator

from torchloom.errors import ComponentError, Problem

Size2D = Annotated[list[PositiveInt], Field(min_length=2, max_length=2)]

# Precomputed float images beyond this size are not kept: the steps then run per sample.
PRECOMPUTE_LIMIT_BYTES = 1 << 30


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RandomCrop(_Strict):
    """A crop of `size` at a random position, after zero `padding` on every side."""

    size: Size2D = Field(..., description="[height, width] of the crop.")
    padding: int = Field(
        0, ge=0, description="Zero pixels added on every side before cropping (4 for CIFAR)."
    )


class Normalization(_Strict):
    """Per-channel standardisation: (pixel - mean) / std, pixels being in [0, 1]."""

    mean: list[float] = Field(..., min_length=1, description="One mean, or one per channel.")
    std: list[PositiveFloat] = Field(
        ..., min_length=1, description="One standard deviation, or one per channel."
    )

    @model_validator(mode="after")
    def _same_length(self) -> Normalization:
        if len(self.mean) != len(self.std):
            raise ValueError(f"mean has {len(self.mean)} values but std has {len(self.std)}")
        return self


class ImageTransforms(_Strict):
    """The transforms of an image task, applied in the order of the fields."""

    resize: Size2D | None = Field(
        None, description="[height, width] to resize to (bilinear, antialiased)."
    )
    random_crop: RandomCrop | None = Field(
        None, description="{size: [height, width], padding: 0}: a random crop (augmentation)."
    )
    horizontal_flip: float = Field(
        0.0, ge=0.0, le=1.0, description="Probability of a left-right flip (augmentation)."
    )
    normalize: Normalization | None = Field(
        None,
        description="{mean: [...], std: [...]}: standardise with these values instead of "
        "the task's own (set the task's `normalize: false`).",
    )
    cutout: PositiveInt | None = Field(
        None,
        description="Side of a square set to 0 in every image, centred on a uniformly random "
        "pixel and clipped at the borders, after normalisation (augmentation; DeVries & "
        "Taylor 2017; DARTS trains CIFAR-10 with 16).",
    )


class Cutout:
    """Zeroes a `size` x `size` square centred on a random pixel of the image, clipped at
    its borders (so near an edge less is cut), as the DARTS reference's `Cutout` does; its
    centre is drawn from torch's global generator like the other random steps."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        height, width = image.shape[-2:]
        y = int(torch.randint(height, ()))
        x = int(torch.randint(width, ()))
        half = self.size // 2
        top, bottom = max(y - half, 0), min(y + self.size - half, height)
        left, right = max(x - half, 0), min(x + self.size - half, width)
        image = image.clone()
        image[..., top:bottom, left:right] = 0
        return image


class ImageTransformer:
    """The transforms of one task for images of a known depth and size.

    `precompute(images)` takes the whole [count, depth, height, width] uint8 set and returns
    what the task should keep; `__call__` takes one kept image and returns the sample. A kept
    image that is still uint8 (the set was too large to precompute, or there was nothing but
    the conversion to floats to precompute) runs every step.
    """

    def __init__(
        self,
        transforms: ImageTransforms,
        depth: int,
        height: int,
        width: int,
        normalization: Normalization | None,
    ) -> None:
        self.transforms = transforms
        self.depth = depth
        # Size after the deterministic steps (what precompute keeps), then the output size.
        self.resized_height, self.resized_width = transforms.resize or (height, width)
        self.height, self.width = self.resized_height, self.resized_width
        if transforms.random_crop is not None:
            self.height, self.width = transforms.random_crop.size
        self.normalization = normalization
        # With nothing but the conversion to floats before the random steps, keeping the set
        # as uint8 (4 times smaller) costs next to nothing per sample. Normalising joins the
        # precomputed part when no step is random (see _compose).
        random = (
            transforms.random_crop is not None
            or transforms.horizontal_flip > 0
            or transforms.cutout is not None
        )
        self._worth_precomputing = transforms.resize is not None or (
            normalization is not None and not random
        )
        self._steps: tuple[Any, Any] | None = None  # made on first use: see _compose

    def _compose(self) -> tuple[Any, Any]:
        """(deterministic, random or None) torchvision pipelines. Made on first use, when
        data is loaded: importing torchvision costs over a second (it imports torch._dynamo),
        which `loom check` does not pay."""
        if self._steps is not None:
            return self._steps
        from torchvision.transforms import v2

        transforms, normalization = self.transforms, self.normalization
        deterministic: list[Any] = [v2.ToDtype(torch.float32, scale=True)]
        if transforms.resize is not None:
            deterministic.append(v2.Resize(list(transforms.resize), antialias=True))
        random: list[Any] = []
        if transforms.random_crop is not None:
            crop = transforms.random_crop
            random.append(v2.RandomCrop(list(crop.size), padding=crop.padding or None))
        if transforms.horizontal_flip > 0:
            random.append(v2.RandomHorizontalFlip(transforms.horizontal_flip))
        if normalization is not None:
            # Normalise last, after any padding, so padded pixels are black as in the usual
            # CIFAR recipe; with no random step it joins the precomputed part.
            normalize = v2.Normalize(
                _per_channel(normalization.mean, self.depth),
                _per_channel(normalization.std, self.depth),
            )
            (random if random or transforms.cutout else deterministic).append(normalize)
        if transforms.cutout is not None:
            random.append(Cutout(transforms.cutout))
        self._steps = (v2.Compose(deterministic), v2.Compose(random) if random else None)
        return self._steps

    def precompute(self, images: torch.Tensor) -> torch.Tensor:
        """The deterministic steps on a whole uint8 set, unless the result would be too big or
        they only convert to floats."""
        count = images.shape[0]
        float_bytes = count * self.depth * self.resized_height * self.resized_width * 4
        if not self._worth_precomputing or float_bytes > PRECOMPUTE_LIMIT_BYTES:
            return images
        deterministic, _ = self._compose()
        return deterministic(images).contiguous()

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        deterministic, random = self._compose()
        if image.dtype == torch.uint8:
            image = deterministic(image)
        if random is not None:
            image = random(image)
        return image

    def random_steps(self, images: torch.Tensor) -> torch.Tensor:
        """A batch [count, depth, height, width] of deterministically transformed images
        through the random steps, each image drawing its own (torchvision's v2 transforms
        would draw once for a whole batch), in order: the draws of `__call__` one by one."""
        _, random = self._compose()
        if random is None:
            return images
        return torch.stack([random(image) for image in images])


def _per_channel(values: Sequence[float], depth: int) -> list[float]:
    return list(values) * depth if len(values) == 1 else list(values)


def build_image_transformer(
    transforms: ImageTransforms,
    depth: int,
    height: int,
    width: int,
    normalization: Normalization | None,
    *,
    subject: str,
    where: str,
) -> ImageTransformer:
    """An `ImageTransformer`, after checking the transforms against the images they will get.

    `normalization` is the task's own (None when its `normalize` is off); a task that has one
    and a `transforms.normalize` as well is told to choose. Problems are a `ComponentError`
    naming `subject` at `where`.
    """
    problems: list[str] = []
    if normalization is not None and transforms.normalize is not None:
        problems.append(
            "both the task's `normalize` and `transforms.normalize` are set; set the task's "
            "`normalize: false` to use transforms.normalize"
        )
    chosen = transforms.normalize or normalization
    if chosen is not None and len(chosen.mean) not in (1, depth):
        problems.append(
            f"transforms.normalize has {len(chosen.mean)} means and stds for images of "
            f"{depth} channel(s); give 1 or {depth}"
        )
    resized_height, resized_width = transforms.resize or (height, width)
    crop = transforms.random_crop
    if crop is not None:
        padded = (resized_height + 2 * crop.padding, resized_width + 2 * crop.padding)
        if crop.size[0] > padded[0] or crop.size[1] > padded[1]:
            problems.append(
                f"transforms.random_crop of {crop.size[0]}x{crop.size[1]} is larger than the "
                f"{padded[0]}x{padded[1]} images (after resize and padding)"
            )
    if problems:
        raise ComponentError([Problem(where, subject, message) for message in problems])
    return ImageTransformer(transforms, depth, height, width, chosen)
