"""The image recipe of an export's sidecar.json (sidecar.py writes it): how the task turned an
image file into the graph's input. Checked whole before an image is read, since a received
export is untrusted input, then applied with numpy and Pillow alone, as a deployment would.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from torchloom.data.image_modes import eight_bit
from torchloom.errors import DeployError, shown_briefly

# The largest side of any size an image recipe names. A received sidecar.json is untrusted, and
# Pillow allocates each resize whole (height x width x depth bytes, and numpy four times that
# as float32): `"resizes": [[60000, 60000]]` asked for 3.6 GB and then 14 GB. 4096 is far above
# the input of any network that classifies whole images (28 to 512 in the zoo, 1024 for large
# detection backbones) and keeps the worst recipe, RGB at 4096 x 4096, near 0.7 GB in all
# (uint8, float32 and a standardised copy).
MAX_IMAGE_SIDE = 4096
# More resizes than an export writes (one, or two for an ImageFolder reading at another size);
# each costs a pass over the image.
MAX_RESIZES = 8


def image_recipe_problem(recipe: dict[str, Any]) -> str:
    """What an image recipe lacks or holds wrongly ('' when it is whole): every field a
    received sidecar gives is checked before an image is read, sizes bounded by
    MAX_IMAGE_SIDE."""
    depth = recipe.get("depth")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth not in (1, 3):
        return f"preprocessing.depth is {depth!r}, not 1 (grey) or 3 (RGB)"
    for key in ("height", "width"):
        if not _is_image_side(recipe.get(key)):
            return f"preprocessing.{key} is {recipe.get(key)!r}, not {_IMAGE_SIDE}"
    scale = recipe.get("scale")
    if not _is_finite_number(scale):
        return f"preprocessing.scale is {scale!r}, not a finite number"
    return _resizes_problem(recipe) or _normalize_problem(recipe.get("normalize"), depth)


_IMAGE_SIDE = f"a positive whole number at most {MAX_IMAGE_SIDE}"


def _is_image_side(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_IMAGE_SIDE


def _is_finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _resizes_problem(recipe: dict[str, Any]) -> str:
    """`resizes`: [height, width] of each resize in order, ending at the graph's height and
    width (absent or null in an export from before they were listed: that size alone)."""
    resizes = recipe.get("resizes")
    if resizes is None:
        return ""
    if (
        not isinstance(resizes, list)
        or not 1 <= len(resizes) <= MAX_RESIZES
        or not all(isinstance(size, list) and len(size) == 2 for size in resizes)
    ):
        return (
            f"preprocessing.resizes is {shown_briefly(resizes)}, not a list of [height, width] "
            f"(1 to {MAX_RESIZES}, one per resize in order)"
        )
    for index, size in enumerate(resizes):
        if not all(_is_image_side(side) for side in size):
            return (
                f"preprocessing.resizes[{index}] is {shown_briefly(size)}: each side must "
                f"be {_IMAGE_SIDE}"
            )
    final = [recipe["height"], recipe["width"]]
    if resizes[-1] != final:
        return (
            f"preprocessing.resizes ends at {resizes[-1]}, not at the graph's height and "
            f"width {final}"
        )
    return ""


def _normalize_problem(normalize: Any, depth: int) -> str:
    """`normalize`: null, or {mean, std} of one finite number per channel, no std 0 (a
    division by it)."""
    if normalize is None:
        return ""
    if not isinstance(normalize, dict):
        shown = shown_briefly(normalize)
        return f"preprocessing.normalize is {shown}, not a mapping of mean and std"
    for key in ("mean", "std"):
        values = normalize.get(key)
        if (
            not isinstance(values, list)
            or len(values) != depth
            or not all(_is_finite_number(value) for value in values)
        ):
            return (
                f"preprocessing.normalize.{key} is {shown_briefly(values)}, not a list of {depth} "
                "finite numbers (one per channel)"
            )
    if 0 in normalize["std"]:
        return f"preprocessing.normalize.std is {normalize['std']}: pixels would be divided by 0"
    return ""


def image_tensor(path: Path, recipe: dict[str, Any]) -> np.ndarray:
    """One image file as the graph's input [1, depth, height, width], float32, the task's way:
    resized (bilinear) as the task resized it, pixels / 255, standardised."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as opened:
            image = eight_bit(opened).convert("L" if recipe["depth"] == 1 else "RGB")
    except (OSError, UnidentifiedImageError, Image.DecompressionBombError, ValueError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise DeployError.at(
            "", f"input '{path}'", f"cannot be read as an image: {reason}"
        ) from error
    # Each resize the task made, in order (a sidecar from before they were listed: the last).
    for height, width in recipe.get("resizes") or [[recipe["height"], recipe["width"]]]:
        if image.size != (width, height):
            image = image.resize((width, height), Image.Resampling.BILINEAR)
    pixels = np.asarray(image, dtype=np.float32) * np.float32(recipe["scale"])
    pixels = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
    normalize = recipe.get("normalize")
    if normalize:
        mean = np.asarray(normalize["mean"], dtype=np.float32)[:, None, None]
        std = np.asarray(normalize["std"], dtype=np.float32)[:, None, None]
        pixels = (pixels - mean) / std
    return pixels[None].astype(np.float32)
