"""Toy training runs for the engine's tests: a config of toy components (tests/toy_components.py,
tests/trust_components.py) that trains in a second, and the helpers that start, stop and read
such runs in this process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from torchloom.config import dump_config
from torchloom.engine.checkpoint import load_checkpoint
from torchloom.engine.run_folder import RunResult
from torchloom.engine.setup import prepare_training
from torchloom.engine.state import Hook, RunView, TrainOptions
from torchloom.engine.trainer import TrainingLoop


def toy_config(epochs: int = 2, **training: Any) -> dict[str, Any]:
    return {
        "name": "toy",
        "training": {
            "task": {"type": "toy_components:ToyTask", "size": 40},
            "dataloader": {"batch_size": 8},
            "optimizer": {"type": "SGD", "lr": 0.1},
            "seed": 3,
            "logging_interval": 2,
            "terminal_conditions": {"epoch_limit": epochs},
            **training,
        },
        "validation": {"task": {"type": "toy_components:ToyTask", "size": 16}},
        "test": {"task": {"type": "toy_components:ToyTask", "size": 16}},
        "pipeline": {
            "model": {
                "type": "toy_components:ToyLinear",
                "globals": {"prediction_size": "num_classes"},
            },
            "loss": {"type": "toy_components:ToyLoss"},
            "counter": {"type": "trust_components:SampleCounter"},
        },
    }


def write(folder: Path, config: dict[str, Any], name: str = "toy.yml") -> Path:
    path = folder / name
    path.write_text(dump_config(config), encoding="utf-8")
    return path


def start(
    config: Path | None, expdir: Path, *hooks: Hook, resume: Path | None = None, **kw: Any
) -> TrainingLoop | RunResult:
    device = kw.pop("device", None)  # None: a GPU where there is one, as `loom train`
    options = TrainOptions(
        expdir=str(expdir), quiet=True, tensorboard=0, hooks=hooks, device=device
    )
    return prepare_training(config, kw.pop("overrides", ()), options, resume=resume)


def train(config: Path | None, expdir: Path, *hooks: Hook, **kw: Any) -> RunResult:
    prepared = start(config, expdir, *hooks, **kw)
    return prepared if isinstance(prepared, RunResult) else prepared.run()


def only_run(expdir: Path) -> Path:
    (run,) = [p for p in expdir.glob("*/*") if p.is_dir()]
    return run


def summary(run: Path) -> dict[str, Any]:
    return dict(json.loads((run / "summary.json").read_text()))


def model_weights(run: Path, name: str = "last.pt") -> dict[str, torch.Tensor]:
    return dict(load_checkpoint(run / "checkpoints" / name)["components"]["model"])


class StopAt(Hook):
    """Asks the run to stop after `episode`, as a Ctrl-C then would (a graceful stop)."""

    name = "stop_at"

    def __init__(self, episode: int) -> None:
        self.episode = episode

    def after_step(self, run: RunView, batch: Any, loss: torch.Tensor) -> None:
        if run.progress.episode == self.episode:
            run.request_stop()
