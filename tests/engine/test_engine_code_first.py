"""Code-first training: a plain nn.Module with Lazy layers, plain datasets, same engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import torchloom
from torchloom import outputs
from torchloom.errors import ConfigError


def clusters(n: int, seed: int) -> TensorDataset:
    """Three well-separated Gaussian clusters in 8 dimensions."""
    generator = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, 3, (n,), generator=generator)
    centres = torch.eye(3, 8) * 4
    inputs = centres[targets] + torch.randn(n, 8, generator=generator)
    return TensorDataset(inputs, targets)


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.LazyLinear(16), nn.ReLU(), nn.LazyLinear(3))

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, outputs.Output]:
        logits = self.body(batch["inputs"])
        return {
            "cluster": outputs.Classification(logits, target="targets"),
            "features": outputs.Embedding(logits),
        }


def test_fit_trains_a_lazy_module_into_a_run_folder(tmp_path: Path) -> None:
    trainer = torchloom.Trainer(
        epochs=3,
        batch_size=32,
        seed=1,
        expdir=tmp_path,
        optimizer={"type": "Adam", "lr": 0.01},
        name="clusters",
    )
    result = trainer.fit(Classifier(), train=clusters(256, 0), validation=clusters(64, 1))
    assert result.status == "epoch_limit" and result.summary["epochs"] == 3
    assert result.run_dir.parent == tmp_path / "clusters"
    assert result.statistics["validation"]["accuracy"] > 0.9
    for name in (
        "config.yaml",
        "summary.json",
        "checkpoints/last.pt",
        "checkpoints/best.pt",
        "training_epoch_statistics.csv",
        "validation_epoch_statistics.csv",
    ):
        assert (result.run_dir / name).is_file(), name
    assert "built in Python from Classifier" in (result.run_dir / "config.yaml").read_text()


def test_fit_resumes_and_extends_a_run(tmp_path: Path) -> None:
    first = torchloom.Trainer(epochs=1, batch_size=32, seed=2, expdir=tmp_path).fit(
        Classifier(), train=clusters(128, 0)
    )
    longer = torchloom.Trainer(epochs=2, batch_size=32, seed=2, expdir=tmp_path).fit(
        Classifier(), train=clusters(128, 0), resume=first.run_dir
    )
    assert longer.run_dir == first.run_dir and longer.summary["epochs"] == 2
    summary = json.loads((first.run_dir / "summary.json").read_text())
    assert summary["episodes"] == 8


def test_regression_output_and_dict_samples(tmp_path: Path) -> None:
    class DictData(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
        def __init__(self) -> None:
            self.x = torch.linspace(-1, 1, 64).unsqueeze(1)

        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"x": self.x[i], "y": 3 * self.x[i]}

    class Line(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(1, 1)

        def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, outputs.Output]:
            return {"fit": outputs.Regression(self.linear(batch["x"]), target="y", loss="l1")}

    result = torchloom.Trainer(
        epochs=30, batch_size=16, seed=0, expdir=tmp_path, optimizer={"type": "SGD", "lr": 0.1}
    ).fit(Line(), DictData())
    assert result.statistics["training"]["loss"] < 0.1


def test_a_module_that_returns_plain_tensors_is_a_clear_error(tmp_path: Path) -> None:
    class Plain(nn.Module):
        def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
            return batch["inputs"]

    with pytest.raises(ConfigError, match="must return"):
        torchloom.Trainer(epochs=1, expdir=tmp_path).fit(Plain(), clusters(8, 0))
    assert not any(tmp_path.iterdir())


def test_unknown_trainer_setting_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="optimiser"):
        torchloom.Trainer(epochs=1, expdir=tmp_path, optimiser={"lr": 1}).fit(
            Classifier(), clusters(8, 0)
        )
