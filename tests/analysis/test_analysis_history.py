"""History curves: series read from the run's CSV files (plus the row an event brings before
the engine writes it), and the PNGs of a small real MNIST run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matplotlib.image import imread

from torchloom.analysis.history import HistoryPlots, draw_history, history_series
from torchloom.analysis.plotting import png_data
from torchloom.analysis.schema import AnalysisConfig
from torchloom.engine.setup import prepare_training
from torchloom.engine.state import TrainOptions


def write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def test_series_join_sections_and_add_a_pending_row_once(tmp_path: Path) -> None:
    write(
        tmp_path / "training_epoch_statistics.csv",
        "epoch,episode,loss,loss_std,accuracy,lr\n1,4,2.0,0.1,0.3,0.001\n2,8,1.5,0.1,0.5,0.001\n",
    )
    write(tmp_path / "validation_epoch_statistics.csv", "epoch,episode,loss,samples\n1,4,1.9,64\n")
    write(tmp_path / "training_statistics.csv", "episode,epoch,loss,batch_size\n2,1,2.2,64\n")
    pending = {("per epoch", "validation"): {"epoch": 2, "episode": 8, "loss": 1.4, "samples": 64}}
    series = history_series(tmp_path, pending)
    assert set(series) == {"loss", "accuracy", "lr"}  # no counters, no spread columns
    assert series["loss"]["per epoch"]["training"] == ([1.0, 2.0], [2.0, 1.5])
    assert series["loss"]["per epoch"]["validation"] == ([1.0, 2.0], [1.9, 1.4])
    assert series["loss"]["per interval"]["training"] == ([2.0], [2.2])
    assert "validation" not in series["accuracy"]["per epoch"]
    # Once the engine has written the row, the same pending row is not added again.
    write(
        tmp_path / "validation_epoch_statistics.csv",
        "epoch,episode,loss,samples\n1,4,1.9,64\n2,8,1.4,64\n",
    )
    again = history_series(tmp_path, pending)
    assert again["loss"]["per epoch"]["validation"] == ([1.0, 2.0], [1.9, 1.4])
    written = draw_history(tmp_path)
    assert sorted(p.name for p in written) == ["accuracy.png", "loss.png", "lr.png"]


@pytest.fixture(scope="module")
def mnist_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder, data = tmp_path_factory.mktemp("history"), tmp_path_factory.mktemp("mnist")
    config = folder / "small.yml"
    write(
        config,
        f"""\
default_configs: [loom://mnist/lenet5.yml]
training:
  task: {{data_folder: {data}, subset: 192}}
  seed: 2
  logging_interval: 1
  terminal_conditions: {{epoch_limit: 2}}
validation:
  task: {{subset: 64}}
""",
    )
    options = TrainOptions(
        expdir=str(folder / "runs"),
        quiet=True,
        tensorboard=0,
        hooks=[HistoryPlots(AnalysisConfig())],
    )
    return prepare_training(config, ["~test"], options).run().run_dir


def test_a_run_draws_every_statistic(mnist_run: Path) -> None:
    history = mnist_run / "reports" / "history"
    names = sorted(p.name for p in history.glob("*.png"))
    assert names == ["accuracy.png", "loss.png", "lr.png", "samples_per_second.png"]
    for name in names:
        image = imread(history / name)
        assert image.ndim == 3 and image.shape[1] > 300 and image.shape[0] > 200
        assert float(image[..., :3].std()) > 0.01, f"{name} is blank"
    # Loss has both panels (per epoch and per interval): a wider picture than lr's one panel.
    assert imread(history / "loss.png").shape[1] > imread(history / "lr.png").shape[1]
    # What the pictures show, from the data stored in them: the last draw saw every row.
    accuracy = png_data(history / "accuracy.png")["panels"]["per epoch"]
    assert accuracy["validation"][0] == accuracy["training"][0] == [1.0, 2.0]
    loss = png_data(history / "loss.png")["panels"]
    assert loss["per interval"]["training"][0] == [float(e) for e in range(1, 7)]
    assert loss == json.loads(json.dumps(history_series(mnist_run)["loss"]))
