"""Embeddings: a stream of the final validation pass in the TensorBoard projector, with class
labels and thumbnails; nothing when TensorBoard is off."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from test_analysis_worst_samples import (
    assert_bit_identical,
    baseline_weights,
    final_weights,
    png_pixels,
    train,
)

from torchloom.analysis.embeddings import THUMBNAIL, EmbeddingExport, thumbnails
from torchloom.analysis.schema import AnalysisConfig, EmbeddingsConfig, OutputSpec
from torchloom.analysis.skipped import read_skipped
from torchloom.engine.distributed import SINGLE

POINTS = 50


def test_final_validation_pass_goes_to_the_projector(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    config = AnalysisConfig(
        embeddings=EmbeddingsConfig(streams=["predictions"], max_samples=POINTS),
        outputs=[OutputSpec(images="inputs")],
    )
    hook = EmbeddingExport(config)
    state = train(tmp_path_factory, [hook], tensorboard=1)
    assert_bit_identical(final_weights(state.run_dir), baseline_weights(tmp_path_factory))

    board = state.run_dir / "tensorboard"
    projector = (board / "projector_config.pbtxt").read_text()
    assert 'tensor_name: "predictions' in projector and "sprite" in projector
    (folder,) = [p for p in board.glob("*/predictions") if p.is_dir()]
    assert int(folder.parent.name) == state.progress.episode  # the step of the last pass
    vectors = (folder / "tensors.tsv").read_text().strip().splitlines()
    assert len(vectors) == POINTS and all(len(v.split("\t")) == 10 for v in vectors)
    labels = (folder / "metadata.tsv").read_text().strip().splitlines()
    assert len(labels) == POINTS and set(labels) <= {str(d) for d in range(10)}
    sprite = png_pixels(folder / "sprite.png")
    assert sprite.shape[0] == sprite.shape[1] == 8 * 28 and sprite.std() > 0.05  # 8 x 8 tiles
    # The rows are those of the last validation pass: its first POINTS predictions.
    assert hook.final is not None and hook.final.rows == POINTS


def test_partial_passes_are_dropped() -> None:
    hook = EmbeddingExport(AnalysisConfig(embeddings=EmbeddingsConfig(streams=["z"])))
    run: Any = SimpleNamespace(log=logging.getLogger("test.embeddings"))
    batch = {"z": torch.randn(4, 3), "targets": torch.tensor([0, 1, 0, 1])}
    hook.eval_batch(run, "validation", batch)
    hook.after_eval(run, "validation", {}, partial=True)
    assert hook.final is None
    hook.eval_batch(run, "test", batch)  # another section: not collected
    hook.eval_batch(run, "validation", batch)
    hook.after_eval(run, "validation", {}, partial=False)
    assert hook.final is not None and hook.final.rows == 4 and len(hook.final.parts) == 1


def test_thumbnails_are_small_and_in_unit_range() -> None:
    images = torch.randn(5, 3, 100, 50) * 4
    small = thumbnails(images)
    assert small.shape == (5, 3, THUMBNAIL, THUMBNAIL // 2)
    assert small.min() >= 0 and small.max() <= 1
    assert thumbnails(torch.zeros(2, 1, 8, 8)).shape == (2, 1, 8, 8)  # constant images: black


def test_tensorboard_off_warns_and_exports_nothing(tmp_path: Path) -> None:
    messages: list[str] = []

    class Log:
        def warning(self, message: str, *args: Any) -> None:
            messages.append(message % args)

    hook = EmbeddingExport(AnalysisConfig(embeddings=EmbeddingsConfig(streams=["z"])))
    run: Any = SimpleNamespace(tensorboard=None, log=Log(), run_dir=tmp_path, distributed=SINGLE)
    hook.before_train(run)
    assert not hook.active and "TensorBoard is off" in messages[0]
    assert "TensorBoard is off" in read_skipped(tmp_path)["embeddings"]  # and in report.html
    hook.eval_batch(run, "validation", {"z": torch.randn(4, 3)})
    hook.after_eval(run, "validation", {}, partial=False)
    hook.after_train(run, {})
    assert hook.final is None
