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
on each batch, all its images at once. In a run, the loaders key each image's draws by (seed,
epoch, its position in the epoch's order) (`keyed_uniform`), so an augmented run is the same
with any number of workers or processes, on the host or the device, and when resumed; read
otherwise (`task[i]`, `task.fetch`, the reservoir's workers, which seed per delivery) random
steps draw from torch's global generator, each image its own numbers, the same whether it
comes alone or in a batch. Augmentation happens only where a config asks for it: random
steps belong in the training task; in a validation or test task they are an error (its
statistics would be those of a new random set at every pass).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import numpy as np
import torch
from pydantic import ConfigDict, Field, PositiveFloat, PositiveInt, model_validator

from torchloom.config_model import ConfigModel
from torchloom.core.host_copies import host_to_device
from torchloom.errors import ComponentError, Problem

Size2D = Annotated[list[PositiveInt], Field(min_length=2, max_length=2)]

# Precomputed float images beyond this size are not kept: the steps then run on each batch.
PRECOMPUTE_LIMIT_BYTES = 1 << 30


class _Strict(ConfigModel):
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


class ImageTransformer:
    """The transforms of one task for images of a known depth and size.

    `precompute(images)` takes the whole [count, depth, height, width] set (as floats in
    [0, 1]) and returns what the task should keep; `__call__` takes one kept image and returns
    the sample, and `random_steps` a batch of them. A set the task keeps as uint8 (too large
    to precompute, or nothing but the conversion to floats to precompute) goes through
    `deterministic_steps` batch by batch.

    The random steps draw each image's numbers in one row of uniforms on the host (a row of
    `torch.rand` in image order, or `keyed_uniform`'s row of its draw), and then crop, flip
    and cut the whole batch at once, on whatever device it lies: a sample drawn alone and the
    same sample in a batch get the same numbers (torch's generator gives rand(1, k) n times as
    it gives rand(n, k) once), so a batch is its samples collated, on the host or on a GPU,
    where a step per image would be several kernel launches each.
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
        crop = transforms.random_crop
        if crop is not None:
            self.height, self.width = crop.size
        self.normalization = normalization
        self.random = crop is not None or transforms.horizontal_flip > 0 or bool(transforms.cutout)
        # With nothing but the conversion to floats before the random steps, keeping the set
        # as uint8 (4 times smaller) costs next to nothing per sample. Normalising joins the
        # precomputed part when no step is random; else it runs after the crop and flip, so
        # padded pixels are black as in the usual CIFAR recipe, and before the cutout.
        self._worth_precomputing = transforms.resize is not None or (
            normalization is not None and not self.random
        )
        self._draws = self._numbers_drawn()
        self._bounds = torch.tensor(list(self._draws.values()), dtype=torch.float64)
        self._flip_column = list(self._draws).index("flip") if "flip" in self._draws else None
        self._aranges: dict[tuple[torch.device, int], torch.Tensor] = {}
        self._resize: Any = None  # made on first use: see _resized
        self._standardisers: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _numbers_drawn(self) -> dict[str, int]:
        """What each image draws, in order: a name and how many values it takes (a flip's
        chance: 0). A crop draws no offset along a side it does not shorten, and a flip of
        probability 1 draws nothing."""
        transforms, draws = self.transforms, dict[str, int]()
        crop = transforms.random_crop
        if crop is not None:
            spare_height = self.resized_height + 2 * crop.padding - crop.size[0]
            spare_width = self.resized_width + 2 * crop.padding - crop.size[1]
            if spare_height:
                draws["top"] = spare_height + 1
            if spare_width:
                draws["left"] = spare_width + 1
        if 0 < transforms.horizontal_flip < 1:
            draws["flip"] = 0
        if transforms.cutout:
            draws["cutout_row"], draws["cutout_column"] = self.height, self.width
        return draws

    def _resized(self, images: torch.Tensor) -> torch.Tensor:
        """`transforms.resize` (bilinear, antialiased), through torchvision, imported on first
        use: importing it costs over a second (it imports torch._dynamo), which `loom check`
        does not pay."""
        if self.transforms.resize is None:
            return images
        if self._resize is None:
            from torchvision.transforms import v2

            self._resize = v2.Resize(list(self.transforms.resize), antialias=True)
        return self._resize(images)

    def _standardised(self, images: torch.Tensor) -> torch.Tensor:
        """(pixel - mean) / std, as torchvision's Normalize computes it, with the mean and std
        made once per device: built from the config's lists at every batch, they would be a
        blocking copy to a GPU each time."""
        if self.normalization is None:
            return images
        device = images.device
        if device not in self._standardisers:
            with torch.inference_mode(False):  # made in an evaluation pass, used in training
                mean, std = (
                    torch.tensor(_per_channel(values, self.depth), dtype=torch.float32)
                    .view(-1, 1, 1)
                    .to(device)
                    for values in (self.normalization.mean, self.normalization.std)
                )
            self._standardisers[device] = (mean, std)
        mean, std = self._standardisers[device]
        return images.sub(mean).div_(std)

    def deterministic_steps(self, images: torch.Tensor) -> torch.Tensor:
        """The steps before the random ones (resize; normalisation when no step is random)
        on a batch of any size: what `precompute` keeps for a set it did not keep."""
        if images.dtype == torch.uint8:  # tasks convert first, to divide on the held device
            images = unit_floats(images)
        images = self._resized(images)
        return images if self.random else self._standardised(images)

    def precompute(self, images: torch.Tensor) -> torch.Tensor:
        """The deterministic steps on a whole set, unless the result would be too big or they
        only convert to floats: then the set is given back, and each batch of it goes through
        `deterministic_steps`."""
        count = images.shape[0]
        float_bytes = count * self.depth * self.resized_height * self.resized_width * 4
        if not self._worth_precomputing or float_bytes > PRECOMPUTE_LIMIT_BYTES:
            return images
        return self.deterministic_steps(images).contiguous()

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        if image.dtype == torch.uint8:
            image = self.deterministic_steps(image.unsqueeze(0))[0]
        return self.random_steps(image.unsqueeze(0))[0]

    def random_steps(
        self, images: torch.Tensor, draws: tuple[int, Sequence[int]] | None = None
    ) -> torch.Tensor:
        """A batch [count, depth, height, width] of deterministically transformed images
        through the random steps, in order: crop, flip, normalisation, cutout. Each image
        draws its own numbers (torchvision's v2 transforms would draw once for a batch): from
        torch's global generator, or with `draws` (seed, a draw number per image) from those
        alone (`keyed_uniform`)."""
        if not self.random:
            return images
        drawn = self._draw(len(images), images.device, draws)
        transforms, count = self.transforms, len(images)
        crop = transforms.random_crop
        if crop is not None:
            if crop.padding:
                images = torch.nn.functional.pad(images, [crop.padding] * 4)  # black
            images = self._cropped(images, drawn.get("top"), drawn.get("left"), crop.size)
        if transforms.horizontal_flip == 1:
            images = images.flip(-1)
        elif "flip" in drawn:
            flipped = drawn["flip"].bool().view(count, 1, 1, 1)
            images = torch.where(flipped, images.flip(-1), images)
        images = self._standardised(images)
        if transforms.cutout:
            images = self._cut_out(images, drawn["cutout_row"], drawn["cutout_column"])
        return images

    def _draw(
        self, count: int, device: torch.device, draws: tuple[int, Sequence[int]] | None
    ) -> dict[str, torch.Tensor]:
        """Each image's numbers: one row of uniform [0, 1) floats from torch's global
        generator (on the host, as every random step of torchloom), or keyed by `draws`,
        turned into integer positions below each draw's bound, or a flip when below its
        chance; copied to `device` at once."""
        if not self._draws:
            return {}
        if draws is None:
            uniform = torch.rand(count, len(self._draws)).double()  # bounds are small: exact
        else:
            uniform = keyed_uniform(draws[0], draws[1], len(self._draws))
        positions = (uniform * self._bounds).long()  # below each bound, since uniform < 1
        if self._flip_column is not None:
            chance = self.transforms.horizontal_flip
            positions[:, self._flip_column] = uniform[:, self._flip_column] < chance
        positions = host_to_device(positions, device)
        return {name: positions[:, index] for index, name in enumerate(self._draws)}

    def _counting(self, length: int, device: torch.device) -> torch.Tensor:
        """0, 1, ..., length - 1 on `device`, made once (on a GPU each is a kernel launch)."""
        key = (device, length)
        if key not in self._aranges:
            with torch.inference_mode(False):  # made in an evaluation pass, used in training
                self._aranges[key] = torch.arange(length, device=device)
        return self._aranges[key]

    def _cropped(
        self,
        images: torch.Tensor,
        top: torch.Tensor | None,
        left: torch.Tensor | None,
        size: list[int],
    ) -> torch.Tensor:
        """Each image's window of `size` at its own top and left (None: 0, the side not
        being shortened), gathered for the whole batch at once."""
        count, depth, _, width = images.shape
        height, cropped_width = size
        if top is not None:
            rows = top.view(count, 1, 1, 1) + self._counting(height, images.device).view(
                1, 1, height, 1
            )
            images = images.gather(2, rows.expand(count, depth, height, width))
        if left is not None:
            columns = left.view(count, 1, 1, 1) + self._counting(cropped_width, images.device).view(
                1, 1, 1, cropped_width
            )
            images = images.gather(3, columns.expand(count, depth, height, cropped_width))
        return images

    def _cut_out(
        self, images: torch.Tensor, rows: torch.Tensor, columns: torch.Tensor
    ) -> torch.Tensor:
        """Cutout (DeVries & Taylor 2017) as the DARTS reference's: zeroes a square of side
        `cutout` centred on each image's drawn pixel, clipped at its borders (so near an edge
        less is cut)."""
        count, _, height, width = images.shape
        size = self.transforms.cutout
        assert size is not None

        def inside(centres: torch.Tensor, length: int) -> torch.Tensor:
            first = (centres - size // 2).view(count, 1)
            pixels = self._counting(length, images.device).view(1, length)
            return (pixels >= first) & (pixels < first + size)

        square = inside(rows, height).view(count, 1, height, 1) & inside(columns, width).view(
            count, 1, 1, width
        )
        return images.masked_fill(square, 0.0)


def unit_floats(images: torch.Tensor, divisor: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 pixels as float32 in [0, 1], divided by 255.

    Not torchvision's conversion, which multiplies by 1/255 instead: that differs in the last
    bit for 126 of the 256 values, and 255 times it is not always the pixel back. MNIST has
    always divided: its samples stay bit-identical to those of earlier versions.

    `divisor`: 255 as a tensor on the images' device, for images on a GPU: there torch divides
    by a Python number by multiplying by its reciprocal (the bit lost above), and by a tensor
    on the device truly.
    """
    return images.to(torch.float32).div_(255.0 if divisor is None else divisor)


def _per_channel(values: Sequence[float], depth: int) -> list[float]:
    return list(values) * depth if len(values) == 1 else list(values)


# splitmix64 (Steele, Lea and Flood 2014): a counter-based generator, whose every output is
# a function of its counter alone, in a few vectorised numpy operations on uint64 (which wrap).
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mixed(values: np.ndarray) -> np.ndarray:
    values = (values ^ (values >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    values = (values ^ (values >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return values ^ (values >> np.uint64(31))


def keyed_uniform(seed: int, draws: Sequence[int], width: int) -> torch.Tensor:
    """[len(draws), width] float64 uniforms in [0, 1), row i a function of (seed, draws[i])
    alone: a loader's augmentation draws, the same whichever process, worker or batch reads
    a sample (engine/loaders.KeyedDraws numbers them)."""
    seeds = _mixed(np.array([seed % 2**64], dtype=np.uint64) + _GOLDEN)
    rows = _mixed(np.asarray(draws, dtype=np.uint64) * _GOLDEN ^ seeds)
    columns = (np.arange(1, width + 1, dtype=np.uint64) * _GOLDEN)[None, :]
    bits = _mixed(rows[:, None] + columns) >> np.uint64(11)  # 53 bits: a double's mantissa
    return torch.from_numpy(bits.astype(np.float64) * 2.0**-53)


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
