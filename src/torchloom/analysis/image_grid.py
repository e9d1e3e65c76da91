"""Pictures of samples: captioned PNG grids, and samples read from a task without disturbing
the run.

A grid has a fixed geometry (`GridLayout`): `columns` tiles a row, each tile a square of
`tile` pixels holding the image (scaled to fit, nearest-neighbour when enlarged so pixels stay
visible) above `caption_lines` lines of text, `PADDING` white pixels between and around tiles.
Images are `[C, H, W]` float tensors in any range (standardised ones included): each is
stretched min-max to its own [0, 255], since display needs no normalisation constants.
Captions are drawn in a font with glyphs for most scripts (`caption_font`), and a character it
lacks is drawn as its base letter or "?", never as a missing-glyph box.

Reading a sample through a task (`task[i]`) runs its random transforms, which draw from the
global generators; `preserved_rng` puts them back as they were, so a run exports samples and
stays bit-identical to a run that does not. PIL, matplotlib's font path and fontTools are
imported inside the functions: `import torchloom` never loads them.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import random
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from torchloom.analysis.schema import OutputSpec
from torchloom.core.component import Batch, Task
from torchloom.core.pipeline import Pipeline
from torchloom.data.atomic_files import atomic_file

if TYPE_CHECKING:
    from PIL import ImageFont

PADDING = 4
TILE = 96
COLUMNS = 8
FONT_SIZE = 11


@dataclass(frozen=True)
class GridLayout:
    """Where each tile of a grid goes; tests check a PNG's size against it."""

    count: int
    columns: int
    tile: int
    caption_lines: int
    line_height: int

    @property
    def rows(self) -> int:
        return math.ceil(self.count / self.columns)

    @property
    def cell_height(self) -> int:
        return self.tile + self.caption_lines * self.line_height

    @property
    def width(self) -> int:
        return PADDING + self.columns * (self.tile + PADDING)

    @property
    def height(self) -> int:
        return PADDING + self.rows * (self.cell_height + PADDING)

    def origin(self, index: int) -> tuple[int, int]:
        """(x, y) of the top-left corner of tile `index` (row-major)."""
        row, column = divmod(index, self.columns)
        return PADDING + column * (self.tile + PADDING), PADDING + row * (
            self.cell_height + PADDING
        )


@functools.cache
def caption_font() -> tuple[ImageFont.ImageFont | ImageFont.FreeTypeFont, frozenset[str]]:
    """The captions' font and the characters it has glyphs for.

    DejaVu Sans, which matplotlib ships (Latin, Greek, Cyrillic, symbols): Pillow's own
    default font has about a hundred characters (no "Σ", no "é"), and draws a box for the
    others. Pillow's font is the fallback, and the bitmap font where Pillow has no FreeType."""
    import matplotlib
    from PIL import ImageFont

    dejavu = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    try:
        font: ImageFont.ImageFont | ImageFont.FreeTypeFont = ImageFont.truetype(
            str(dejavu), FONT_SIZE
        )
    except (OSError, ImportError):  # no such file, or Pillow without FreeType
        try:
            font = ImageFont.load_default(size=FONT_SIZE)
        except (OSError, ValueError):
            font = ImageFont.load_default()
    return font, _characters(font)


def _characters(font: Any) -> frozenset[str]:
    """Characters with a glyph in the font: its character map (FreeType fonts), else the
    printable ASCII characters (Pillow's bitmap font)."""
    from fontTools.ttLib import TTFont

    source = getattr(font, "path", None)
    if isinstance(source, io.BytesIO):  # Pillow's default font, embedded in Pillow
        source = io.BytesIO(source.getvalue())
    if source is None:
        return frozenset(chr(code) for code in range(32, 127))
    return frozenset(chr(code) for code in TTFont(source, lazy=True).getBestCmap())


def drawable(text: str, characters: frozenset[str]) -> str:
    """The text with each character the font has no glyph for replaced, by its base letter
    when it has one ("é" -> "e"), else by "?": a caption never shows a missing-glyph box."""
    if all(c in characters for c in text):
        return text
    kept = []
    for character in text:
        if character in characters:
            kept.append(character)
            continue
        parts = unicodedata.normalize("NFKD", character)
        base = "".join(c for c in parts if c in characters and not unicodedata.combining(c))
        kept.append(base or "?")
    return "".join(kept)


def _line_height(font: Any) -> int:
    return int(font.getbbox("Ag")[3]) + 2


def grid_layout(
    count: int, caption_lines: int, tile: int = TILE, columns: int = COLUMNS
) -> GridLayout:
    """The geometry `save_grid` uses for `count` images with captions of that many lines."""
    return GridLayout(
        count, max(1, min(count, columns)), tile, caption_lines, _line_height(caption_font()[0])
    )


def display_pixels(image: torch.Tensor) -> np.ndarray:
    """An image [C, H, W] (or [H, W]) as uint8 [H, W] (grey) or [H, W, 3] (colour), each
    stretched min-max on its own. Channel counts other than 1 and 3 show the first channel."""
    image = image.detach().to("cpu", torch.float32)
    if image.ndim == 2:
        image = image.unsqueeze(0)
    if image.shape[0] != 3:
        image = image[:1]
    low, high = image.min(), image.max()
    scaled = (image - low) / (high - low) if high > low else torch.zeros_like(image)
    pixels = (scaled * 255).round().to(torch.uint8)
    return (pixels[0] if pixels.shape[0] == 1 else pixels.permute(1, 2, 0)).numpy()


def _fit(text: str, font: Any, width: int, characters: frozenset[str]) -> str:
    """The text, drawable in the font and cut with an ellipsis to fit `width` pixels."""
    text = drawable(text, characters)
    if font.getlength(text) <= width:
        return text
    ellipsis = drawable("…", characters)
    while text and font.getlength(text + ellipsis) > width:
        text = text[:-1]
    return text + ellipsis


def save_grid(
    images: Sequence[torch.Tensor],
    captions: Sequence[str],
    path: Path,
    tile: int = TILE,
    columns: int = COLUMNS,
) -> GridLayout:
    """One PNG of the images in a grid, each with its caption ('\\n' separates lines) below."""
    from PIL import Image, ImageDraw

    assert images and len(images) == len(captions), "one caption per image, at least one image"
    font, characters = caption_font()
    lines = max(len(c.split("\n")) for c in captions)
    layout = grid_layout(len(images), lines, tile, columns)
    canvas = Image.new("RGB", (layout.width, layout.height), "white")
    draw = ImageDraw.Draw(canvas)
    for index, (image, caption) in enumerate(zip(images, captions, strict=True)):
        picture = Image.fromarray(display_pixels(image)).convert("RGB")
        scale = tile / max(picture.size)
        size = (max(1, round(picture.width * scale)), max(1, round(picture.height * scale)))
        resample = Image.Resampling.NEAREST if scale >= 1 else Image.Resampling.LANCZOS
        picture = picture.resize(size, resample)
        x, y = layout.origin(index)
        canvas.paste(picture, (x + (tile - size[0]) // 2, y + (tile - size[1]) // 2))
        for number, line in enumerate(caption.split("\n")):
            top = y + tile + number * layout.line_height
            draw.text((x, top), _fit(line, font, tile, characters), fill="black", font=font)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as out:  # a report reader never sees half a picture
        canvas.save(out, format="PNG")
    return layout


def markdown_cell(value: object, limit: int = 300) -> str:
    """A value as one markdown table cell: one line, pipes escaped, at most `limit` characters."""
    text = " ".join(str(value).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---- samples from tasks ----------------------------------------------------------------------
@contextlib.contextmanager
def preserved_rng(seed: int | None = None) -> Iterator[None]:
    """Run the body with python's, numpy's and torch's (CPU, and CUDA once it is in use)
    generators put back as they were afterwards; seeded with `seed` inside when given, so what
    the body draws is the same in every run with that seed."""
    python, numpy_state, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        if seed is not None:
            random.seed(seed)
            np.random.seed(seed % 2**32)
            torch.default_generator.manual_seed(seed)  # CPU only: the tasks' transforms
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy_state)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def task_key(task: Task, stream: str | None) -> str | None:
    """The task's own key for a pipeline-wide stream name (None: the task does not publish it)."""
    if stream is None:
        return None
    return next((key for key in task.output_specs() if task.stream_name(key) == stream), None)


def image_key(task: Task, stream: str | None) -> str | None:
    """The task's key of the image stream: the named one, else its only [batch, C, H, W]
    float stream (what every image task publishes as `inputs`)."""
    if stream is not None:
        return task_key(task, stream)
    found = [
        key
        for key, spec in task.output_specs().items()
        if spec.dims is not None
        and len(spec.dims) == 4
        and spec.dtypes is not None
        and any(isinstance(t, torch.dtype) and t.is_floating_point for t in spec.dtypes)
    ]
    return found[0] if len(found) == 1 else None


def fetch_samples(task: Task, ids: Sequence[int], seed: int | None = None) -> list[Batch]:
    """`task[i]` for each id, the run's random generators untouched."""
    with preserved_rng(seed):
        return [task[int(i)] for i in ids]


def class_names(pipeline: Pipeline, output: OutputSpec) -> list[str] | None:
    """Class names by index from the output's `name -> index` global (None when there is
    none). The default global, the task's classes, names only an output whose targets a task
    publishes: another head's targets (a multitask pipeline's parity, made from the digits)
    have classes of their own, numbered."""
    mapping = output.class_names
    if mapping is None or mapping not in pipeline.globals:
        return None
    tasks = pipeline.tasks.values()
    if "class_names" not in output.model_fields_set and not any(
        task_key(task, output.targets) is not None for task in tasks
    ):
        return None
    value = pipeline.globals.get(mapping, "analysis")
    if not isinstance(value, dict):
        return None
    names = [str(i) for i in range(max(value.values(), default=-1) + 1)]
    for name, index in value.items():
        names[int(index)] = str(name)
    return names


def class_label(index: int, names: Sequence[str] | None) -> str:
    """A class as a person reads it: its name when known (and not just the number)."""
    if names is None or not 0 <= index < len(names) or names[index] == str(index):
        return str(index)
    return f"{index} {names[index]}"
