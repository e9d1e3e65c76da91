"""Sample export: random samples and augmentations as captioned grids, drawn without touching
the run's random streams."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_analysis_worst_samples import (
    RANDOM_CROP,
    assert_bit_identical,
    baseline_weights,
    fake_run,
    final_weights,
    png_pixels,
    train,
)

from torchloom.analysis.image_grid import (
    GridLayout,
    caption_font,
    grid_layout,
    preserved_rng,
    save_grid,
)
from torchloom.analysis.sample_export import SampleExport, augmentations, random_ids
from torchloom.analysis.schema import (
    AnalysisConfig,
    AugmentationConfig,
    OutputSpec,
    SampleExportConfig,
)


def tiles(pixels: np.ndarray, layout: GridLayout) -> list[np.ndarray]:
    """The image square of every tile of a grid PNG, in order."""
    found = []
    for index in range(layout.columns * layout.rows):
        x, y = layout.origin(index)
        found.append(pixels[y : y + layout.tile, x : x + layout.tile, :3])
    return found


def test_random_ids_are_distinct_and_follow_the_seed() -> None:
    state = torch.get_rng_state()
    ids = random_ids(100, 16, seed=3)
    assert len(set(ids)) == 16 and all(0 <= i < 100 for i in ids)
    assert ids == random_ids(100, 16, seed=3) and ids != random_ids(100, 16, seed=4)
    assert sorted(random_ids(5, 16, seed=3)) == [0, 1, 2, 3, 4]
    assert torch.equal(torch.get_rng_state(), state)  # a private generator


def test_preserved_rng_puts_every_generator_back() -> None:
    def draw() -> tuple[float, float, float]:
        return random.random(), float(np.random.rand()), float(torch.rand(1))

    def reseed() -> None:
        random.seed(0)
        np.random.seed(0)
        torch.manual_seed(0)

    reseed()
    expected = draw()
    reseed()
    with preserved_rng(seed=5):
        inside = draw()
        torch.rand(100)
    assert draw() == expected  # as if nothing had been drawn
    with preserved_rng(seed=5):
        assert draw() == inside  # seeded inside: the same draws every time


def test_grid_geometry(tmp_path: Path) -> None:
    images = [torch.rand(1, 28, 28) * 5 - 2 for _ in range(11)]  # standardised-looking
    layout = save_grid(images, [f"#{i}\nlabel {i}" for i in range(11)], tmp_path / "g.png")
    assert layout == grid_layout(11, caption_lines=2)
    assert (layout.columns, layout.rows) == (8, 2)
    pixels = png_pixels(tmp_path / "g.png")
    assert pixels.shape[:2] == (layout.height, layout.width)
    squares = tiles(pixels, layout)
    assert all(square.std() > 0.1 for square in squares[:11])  # an image in each tile
    assert all(square.min() == 1.0 for square in squares[11:])  # the rest of the row is blank
    colour = save_grid([torch.rand(3, 40, 20)], ["one"], tmp_path / "c.png")
    assert png_pixels(tmp_path / "c.png").shape[:2] == (colour.height, colour.width)


def caption_pixels(folder: Path, text: str) -> np.ndarray:
    """The caption area of a one-tile grid captioned `text`."""
    layout = save_grid([torch.rand(1, 8, 8)], [text], folder / "caption.png")
    x, y = layout.origin(0)
    return png_pixels(folder / "caption.png")[y + layout.tile : y + layout.cell_height, x:]


def test_captions_never_draw_a_missing_glyph_box(tmp_path: Path) -> None:
    drawn = {
        text: caption_pixels(tmp_path, text)
        for text in ("Σ", "é", "ж", "?", "\ue000")  # U+E000: private use, in no font
    }
    # A character no font has is drawn as "?" (Pillow's fonts draw the same box for all).
    assert np.array_equal(drawn["\ue000"], drawn["?"])
    # Greek, accented and Cyrillic letters have glyphs: each is drawn, and as itself.
    letters = [drawn[text] for text in ("Σ", "é", "ж")]
    for index, pixels in enumerate(letters):
        assert pixels.min() < 0.5, "nothing drawn"
        assert not np.array_equal(pixels, drawn["\ue000"]) and not np.array_equal(
            pixels, drawn["?"]
        )
        assert not any(np.array_equal(pixels, other) for other in letters[index + 1 :])
    _, characters = caption_font()
    assert {"Σ", "é", "ж", "…"} <= characters and "\ue000" not in characters


def test_run_exports_samples_and_augmentations_bit_identically(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    config = AnalysisConfig(
        random_samples=SampleExportConfig(count=10),
        augmentation=AugmentationConfig(count=6, sample=3),
    )
    state = train(tmp_path_factory, [SampleExport(config)], RANDOM_CROP)
    assert_bit_identical(
        final_weights(state.run_dir), baseline_weights(tmp_path_factory, RANDOM_CROP)
    )

    folder = state.run_dir / "reports" / "samples"
    random_grid = png_pixels(folder / "random_training.png")
    layout = grid_layout(10, caption_lines=2)  # "#id" and the label
    assert random_grid.shape[:2] == (layout.height, layout.width)
    assert all(square.std() > 0.05 for square in tiles(random_grid, layout)[:10])

    augmented = png_pixels(folder / "augmentation.png")
    layout = grid_layout(6, caption_lines=2)
    assert augmented.shape[:2] == (layout.height, layout.width)
    squares = tiles(augmented, layout)[:6]
    assert any(not np.array_equal(squares[0], other) for other in squares[1:])

    # The draws themselves: different crops, the same for a seed, the run's RNG untouched.
    task = state.train_data.task
    before = torch.get_rng_state()
    draws = [sample["inputs"] for sample in augmentations(task, 3, 6, seed=11)]
    assert torch.equal(torch.get_rng_state(), before)
    assert any(not torch.equal(draws[0], other) for other in draws[1:])
    again = [sample["inputs"] for sample in augmentations(task, 3, 6, seed=11)]
    assert all(torch.equal(a, b) for a, b in zip(draws, again, strict=True))


def test_nothing_is_drawn_when_both_items_are_off() -> None:
    hook = SampleExport(AnalysisConfig(preset="minimal"))
    # A run with nothing but its progress: the hook must not reach for a task.
    hook.before_train(SimpleNamespace(progress=SimpleNamespace(episode=0)))  # type: ignore[arg-type]


def test_a_task_of_texts_gets_a_table(tmp_path: Path) -> None:
    config = AnalysisConfig(
        random_samples=SampleExportConfig(count=4), outputs=[OutputSpec(texts="texts")]
    )
    SampleExport(config).before_train(fake_run(tmp_path))
    table = (tmp_path / "reports" / "samples" / "random_training.md").read_text().splitlines()
    assert len(table) == 2 + 4 and all("text \\| number" in row for row in table[2:])
