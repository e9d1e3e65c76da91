"""Everything a training run holds, set up from a config (new run) or a run folder (resume).

Order matters for exact resume: seed, build the pipeline (weight init draws from the seeded
RNG), set up loaders and optimizer, and only then restore a checkpoint's states — RNG last,
so nothing drawn during set-up shifts the resumed run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from torchloom.config.schema import TrainingConfig, ValidationConfig
from torchloom.core.component import Statistic
from torchloom.core.pipeline import Pipeline
from torchloom.core.weights import load_pipeline_weights
from torchloom.engine.divergence import DivergenceGuard
from torchloom.engine.hooks import Hook, Hooks
from torchloom.engine.loaders import SectionLoader
from torchloom.engine.losses import WeightedLoss
from torchloom.engine.precision import Precision
from torchloom.engine.reporting import Reporter, close_logger
from torchloom.engine.run_folder import RunLock
from torchloom.engine.seeding import restore_rng_state
from torchloom.engine.signals import StopSignals
from torchloom.engine.terminal import Monitor
from torchloom.statistics.accumulators import RunningStats


@dataclass
class TrainOptions:
    expdir: str = "runs"
    tag: str = ""
    device: str | None = None
    quiet: bool = False
    tensorboard: int = 1
    disable: Sequence[str] = ()
    hooks: Sequence[Hook] = ()
    # Builds more hooks from the loaded config and the built pipeline (the analysis section);
    # given by the caller, so the engine never imports the analysis package.
    hook_factory: Callable[[Mapping[str, Any], Pipeline, Callable[..., str]], Sequence[Hook]] | (
        None
    ) = None


@dataclass
class Progress:
    epoch: int = 0  # completed epochs
    episode: int = 0  # batches trained on
    batch_in_epoch: int = 0
    wall_time: float = 0.0  # seconds spent in earlier sessions of this run (resumed ones)

    def state_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)


@dataclass
class RunState:
    name: str
    config: TrainingConfig
    run_dir: Path
    device: torch.device
    seed: int
    pipeline: Pipeline
    train_data: SectionLoader
    validation_data: SectionLoader | None
    validation_config: ValidationConfig | None
    test_data: SectionLoader | None
    optimizer: torch.optim.Optimizer
    scheduler: Any
    precision: Precision
    loss: WeightedLoss
    guard: DivergenceGuard
    reporter: Reporter
    log: Any
    monitor: Monitor
    signals: StopSignals
    show_progress: bool
    train_statistics: dict[str, Statistic]
    validation_statistics: dict[str, Statistic]
    # Training statistics over the current logging interval only (the rows of
    # training_statistics.csv); train_statistics runs over the whole epoch.
    interval_statistics: dict[str, Statistic]
    lock: RunLock  # held while this process trains in run_dir
    config_text: str  # the run's config.yaml as it started: resume checks it is unchanged
    hooks: Hooks = field(default_factory=Hooks)
    compiled_models: list[str] = field(default_factory=list)  # by `training.compile`
    progress: Progress = field(default_factory=Progress)
    best_statistics: dict[str, float] = field(default_factory=dict)
    latest: dict[str, dict[str, float]] = field(default_factory=dict)
    interval_loss: RunningStats = field(default_factory=RunningStats)
    epoch_loss: RunningStats = field(default_factory=RunningStats)
    interval_samples: int = 0
    interval_started: float = field(default_factory=time.perf_counter)
    session_started: float = field(default_factory=time.perf_counter)

    @property
    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for g in self.optimizer.param_groups for p in g["params"] if p.requires_grad]

    @property
    def accumulation(self) -> int:
        return self.config.gradient_accumulation

    @property
    def scheduler_interval(self) -> str:
        return self.config.scheduler.interval if self.config.scheduler else "epoch"

    @property
    def online(self) -> bool:
        return self.config.mode == "online"

    @property
    def partial_interval(self) -> int:
        assert self.validation_config is not None
        return self.validation_config.partial_validation_interval or self.config.logging_interval

    @property
    def partial_batches(self) -> int:
        assert self.validation_config is not None
        return self.validation_config.partial_validation_batches

    def stop_requested(self) -> bool:
        return self.signals.requested

    def wall_time(self) -> float:
        """Seconds of training over every session of this run, this one included."""
        return self.progress.wall_time + time.perf_counter() - self.session_started

    def progress_state(self) -> dict[str, Any]:
        return {**self.progress.state_dict(), "wall_time": self.wall_time()}

    def running_state(self) -> dict[str, Any]:
        return {
            "epoch_loss": self.epoch_loss.state_dict(),
            "interval_loss": self.interval_loss.state_dict(),
            "interval_samples": self.interval_samples,
            "train_statistics": {n: s.state_dict() for n, s in self.train_statistics.items()},
            "interval_statistics": {n: s.state_dict() for n, s in self.interval_statistics.items()},
            "latest": self.latest,
            "csv_rows": self.reporter.row_counts(),
            # Gradients summed so far in an unfinished accumulation window (a save between
            # two optimizer steps): without them a resumed run would step on fewer batches.
            "gradients": [p.grad for p in self.parameters]
            if self.progress.batch_in_epoch % self.accumulation
            else None,
        }

    def restore(self, checkpoint: dict[str, Any], source: str) -> None:
        load_pipeline_weights(self.pipeline.components, checkpoint["components"], source)
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        if self.scheduler is not None and checkpoint["scheduler"] is not None:
            self.scheduler.load_state_dict(checkpoint["scheduler"])
        self.precision.load_state_dict(checkpoint["precision"])
        self.progress.load_state_dict(checkpoint["progress"])
        self.monitor.load_state_dict(checkpoint["monitor"])
        self.best_statistics = checkpoint["best_statistics"]
        running = checkpoint["running"]
        self.epoch_loss.load_state_dict(running["epoch_loss"], self.device)
        self.interval_loss.load_state_dict(running["interval_loss"], self.device)
        self.interval_samples = running["interval_samples"]
        for name, statistic in self.train_statistics.items():
            statistic.load_state_dict(running["train_statistics"][name])
        for name, state in running.get("interval_statistics", {}).items():
            self.interval_statistics[name].load_state_dict(state)
        if running.get("gradients") is not None:
            for parameter, gradient in zip(self.parameters, running["gradients"], strict=True):
                parameter.grad = None if gradient is None else gradient.to(parameter.device)
        self.latest = running["latest"]
        self.hooks.load_state_dict(checkpoint.get("hooks", {}))
        restore_rng_state(checkpoint["rng"])

    def close(self) -> None:
        self.reporter.close()
        close_logger(self.log)
        self.lock.release()
