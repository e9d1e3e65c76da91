"""Viewers: StreamViewer logs one sample every interval; ImageViewer writes PNG grids into
the folder of the pass, and nothing without one."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy
import pytest
import torch
from PIL import Image, ImageStat

import torchloom
from torchloom.zoo.viewers import ImageViewer, StreamViewer, _captions, preview_value


def batch(size: int = 4) -> dict[str, object]:
    return {
        "images": torch.rand(size, 1, 28, 28),
        "targets": torch.arange(size),
        "predictions": torch.eye(size, 10).flip(0).log_softmax(dim=1),  # every one wrong
        "texts": [f"sentence number {i}" for i in range(size)],
        "loss": torch.tensor(0.25),
    }


def test_stream_viewer_logs_one_sample_at_the_interval(caplog: pytest.LogCaptureFixture) -> None:
    viewer = StreamViewer.create(
        name="viewer", input_streams=["texts", "targets", "images", "loss"], interval=3, sample=1
    )
    caplog.set_level(logging.INFO, logger="torchloom.viewer")
    for _ in range(7):
        viewer(batch())
    records = [r for r in caplog.records if r.name == "torchloom.viewer"]
    assert [r.getMessage().split(":")[1].strip() for r in records] == [
        "training batch 1, sample 1",
        "training batch 4, sample 1",
        "training batch 7, sample 1",
    ]
    message = records[0].getMessage()
    assert "texts: sentence number 1" in message  # strings as they are, of sample 1
    assert "targets: 1" in message
    assert "images: tensor[1, 28, 28] float32 [" in message and ", ...]" in message
    assert "loss: 0.25" in message  # an unbatched stream as it is


def test_stream_viewer_counts_evaluation_batches_apart(caplog: pytest.LogCaptureFixture) -> None:
    viewer = StreamViewer.create(input_streams=["targets"], interval=2, sample=9)
    caplog.set_level(logging.INFO, logger="torchloom.viewer")
    viewer(batch())
    viewer.eval()
    viewer(batch())
    viewer(batch())
    messages = [r.getMessage() for r in caplog.records if r.name == "torchloom.viewer"]
    assert len(messages) == 2 and "evaluation batch 1" in messages[1]
    assert "targets: 3" in messages[0], "sample 9 of a batch of 4 is its last one"


def test_describe_value_is_short() -> None:
    assert preview_value(torch.zeros(3, 100)).endswith("[0, 0, 0, 0, 0, 0, ...]")
    assert len(preview_value("x" * 5000)) < 1100
    assert preview_value(torch.tensor(7)) == "7"


def test_image_viewer_writes_grids_into_the_pass_folder(tmp_path: Path) -> None:
    viewer = ImageViewer.create(
        name="grid",
        images="images",
        labels="targets",
        predictions="predictions",
        interval=2,
        count=3,
    )
    viewer(batch())  # no pass: nothing
    assert not (tmp_path / "viewers").exists()
    viewer.begin_pass("test", tmp_path)
    for _ in range(3):
        viewer(batch())
    viewer.end_pass()
    viewer(batch())  # after the pass: nothing
    files = sorted((tmp_path / "viewers").iterdir())
    assert [f.name for f in files] == ["grid-test-000001.png", "grid-test-000003.png"]
    picture = Image.open(files[0])
    assert picture.format == "PNG" and picture.size[0] > 200
    assert ImageStat.Stat(picture.convert("L")).stddev[0] > 10
    # Captions in red: every prediction is wrong.
    pixels = numpy.asarray(picture.convert("RGB")).astype(int)
    assert ((pixels[..., 0] > 200) & (pixels[..., 1] < 80)).sum() > 20


def test_image_viewer_respects_its_limit_and_the_training_phases(tmp_path: Path) -> None:
    viewer = ImageViewer.create(name="v", images="images", interval=1, count=2, limit=2)
    viewer.begin_pass("training", tmp_path)
    viewer(batch())
    viewer.eval()  # evaluation batches of a training run are validation batches
    viewer(batch())
    viewer(batch())
    names = sorted(p.name for p in (tmp_path / "viewers").iterdir())
    assert names == ["v-training-000001.png", "v-validation-000001.png"]


def test_image_viewer_captions_compare_like_with_like() -> None:
    scores = torch.tensor([[0.1, 0.9], [0.8, 0.2]])
    assert _captions(torch.tensor([1, 1]), scores, 2) == [
        ("label 1 / pred 1", False),
        ("label 1 / pred 0", True),
    ]
    # A class name is never compared with a class index.
    assert _captions(["cat", "dog"], scores, 2)[1] == ("label dog / pred 0", False)
    assert _captions(None, None, 1) == [("", False)]


def test_image_viewer_that_cannot_write_stops_viewing_not_the_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "viewers").write_text("a file where the folder should be")
    viewer = ImageViewer.create(name="v", images="images", interval=1)
    viewer.begin_pass("test", tmp_path)
    viewer(batch())
    viewer(batch())
    assert viewer.written == []
    assert [r.levelname for r in caplog.records if r.name == "torchloom.viewer"] == ["WARNING"]


def test_viewers_in_a_training_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Named as a third-party component would be (`module:Class`), in a real pipeline."""
    config = tmp_path / "viewers.yml"
    config.write_text(
        f"""\
default_configs: [loom://mnist/lenet5.yml]
training:
  task: {{data_folder: {tmp_path / "mnist"}, subset: 128}}
  terminal_conditions: {{epoch_limit: 1}}
validation:
  task: {{subset: 64}}
test:
  task: {{subset: 64}}
pipeline:
  stream_viewer:
    type: torchloom.zoo.viewers:StreamViewer
    input_streams: [labels, predictions]
    interval: 2
  image_viewer:
    type: torchloom.zoo.viewers:ImageViewer
    images: inputs
    labels: labels
    predictions: predictions
    interval: 2
    count: 8
""",
        encoding="utf-8",
    )
    caplog.set_level(logging.INFO, logger="torchloom.viewer")
    run = torchloom.train(
        config, expdir=str(tmp_path / "runs"), analysis=False, tensorboard=0
    ).run_dir
    names = sorted(p.name for p in (run / "viewers").iterdir())
    assert names == ["image_viewer-training-000001.png", "image_viewer-validation-000001.png"]
    messages = [r.getMessage() for r in caplog.records if r.name == "torchloom.viewer"]
    assert "stream_viewer: training batch 1, sample 0: labels: " in messages[0]
    assert "predictions: tensor[10] float32" in messages[0]
