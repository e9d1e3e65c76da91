"""Learning rates: the recorder on a run with a scheduler, the range test's suggestion rule,
`lr_find` (and `loom lr-find`'s module) on a small MNIST subset, and its user errors."""

from __future__ import annotations

import csv
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from torchloom.analysis.learning_rate import LearningRateRecorder, lr_find, suggest
from torchloom.analysis.plotting import png_data
from torchloom.analysis.schema import AnalysisConfig
from torchloom.cli.main import main
from torchloom.engine.run_state import TrainOptions
from torchloom.engine.trainer import Trainer
from torchloom.engine.training_setup import prepare_training
from torchloom.errors import ConfigError


def small_config(folder: Path, data: Path) -> Path:
    path = folder / "small.yml"
    path.write_text(
        f"""\
default_configs: [loom://mnist/lenet5.yml]
training:
  task: {{data_folder: {data}, subset: 128}}
  dataloader: {{batch_size: 32}}
  seed: 4
  logging_interval: 2
  terminal_conditions: {{epoch_limit: 2}}
validation:
  task: {{subset: 64}}
""",
        encoding="utf-8",
    )
    return path


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_config(tmp_path_factory.mktemp("lr"), tmp_path_factory.mktemp("mnist"))


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def assert_png_has_content(path: Path) -> None:
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert float(image[..., :3].std()) > 0.01, f"{path.name} is blank"


def test_recorder_follows_a_scheduler(config: Path, tmp_path: Path) -> None:
    options = TrainOptions(
        expdir=str(tmp_path),
        quiet=True,
        tensorboard=0,
        hooks=[LearningRateRecorder(AnalysisConfig())],
    )
    overrides = [
        "~training.scheduler",
        "+training.scheduler={type: StepLR, step_size: 1, gamma: 0.5}",
        "~test",
    ]
    run = Trainer(prepare_training(config, overrides, options)).run().run_dir
    recorded = rows(run / "reports" / "learning_rate.csv")
    # The start, then every 2 of 4 batches an epoch; the rate halves after each epoch.
    assert [int(r["episode"]) for r in recorded] == [0, 2, 4, 6, 8]
    assert [float(r["lr_group_0"]) for r in recorded] == [1e-3, 1e-3, 1e-3, 5e-4, 5e-4]
    assert [int(r["epoch"]) for r in recorded] == [0, 1, 1, 2, 2]
    assert_png_has_content(run / "reports" / "learning_rate.png")


def test_suggestion_is_the_steepest_descent_of_the_smoothed_loss() -> None:
    rates = np.logspace(-6, 0, 61)
    # A loss that falls fastest at 1e-3 (a logistic step in log-rate), then diverges.
    losses = 2.0 - 1.5 / (1 + np.exp(-(np.log10(rates) + 3) * 3)) + (rates > 0.3) * 10
    assert suggest(rates.tolist(), losses.tolist()) == pytest.approx(1e-3, rel=0.3)
    assert suggest([1e-4, 1e-3], [1.0, 0.5]) == 1e-3  # too few points: the lowest loss
    assert suggest([1e-4, 1e-3, 1e-2], [math.nan] * 3) == 1e-4


def test_lr_find_on_mnist(config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Through the real command line: `loom lr-find` parses its options around the overrides.
    assert (
        main(
            [
                "lr-find",
                str(config),
                "--start-lr",
                "1e-4",
                "--end-lr",
                "10",
                "training.optimizer.type=SGD",
                "--steps",
                "16",
                "--expdir",
                str(tmp_path),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    (run,) = (tmp_path / "small").iterdir()
    assert run.name.endswith("_lr_find") and f"run folder: {run}" in printed
    summary = json.loads((run / "lr_find.json").read_text())
    assert 1e-4 <= summary["suggested_lr"] <= 10.0
    assert f"suggested learning rate: {summary['suggested_lr']:.3g}" in printed
    table = rows(run / "lr_find.csv")
    assert len(table) == summary["steps_run"] <= 16
    rates = [float(r["lr"]) for r in table]
    assert rates[0] == pytest.approx(1e-4) and all(b > a for a, b in itertools.pairwise(rates))
    if summary["steps_run"] == 16:
        assert rates[-1] == pytest.approx(10.0)
    assert any(r == pytest.approx(summary["suggested_lr"], rel=1e-6) for r in rates)
    assert_png_has_content(run / "lr_find.png")
    assert png_data(run / "lr_find.png") == {"suggested_lr": summary["suggested_lr"]}
    assert (run / "config.yaml").is_file()


def test_lr_find_user_errors_leave_no_run_folder(config: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="optimizer"):
        lr_find(config, ["training.optimizer.lrr=0.1"], expdir=tmp_path, steps=5)
    with pytest.raises(ConfigError, match="--end-lr"):
        lr_find(config, [], start_lr=1.0, end_lr=0.1, expdir=tmp_path)
    assert not any(tmp_path.iterdir())
