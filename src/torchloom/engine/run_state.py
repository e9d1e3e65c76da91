"""Everything a training run holds, set up from a config (new run) or a run folder (resume).

Order matters for exact resume: seed, build the pipeline (weight init draws from the seeded
RNG), set up loaders and optimizer, and only then restore a checkpoint's states — RNG last,
so nothing drawn during set-up shifts the resumed run.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from torchloom.config import dump_config
from torchloom.config.schema import TrainingConfig, ValidationConfig
from torchloom.core.component import Statistic
from torchloom.core.pipeline import Pipeline
from torchloom.engine.assemble import build_checked, load_and_validate, pipeline_name
from torchloom.engine.checkpoint import load_checkpoint
from torchloom.engine.devices import resolve_device
from torchloom.engine.divergence import DivergenceGuard
from torchloom.engine.evaluation import statistics_copy
from torchloom.engine.loaders import SectionLoader
from torchloom.engine.losses import WeightedLoss
from torchloom.engine.optim import build_optimizer, build_scheduler
from torchloom.engine.precision import Precision
from torchloom.engine.reporting import Reporter, close_logger, make_logger
from torchloom.engine.run_folder import create_run_folder, write_text_atomic
from torchloom.engine.seeding import restore_rng_state, seed_everything, set_deterministic
from torchloom.engine.signals import StopSignals
from torchloom.engine.terminal import Monitor, make_monitor
from torchloom.errors import ConfigError, Problem
from torchloom.statistics.accumulators import RunningStats


@dataclass
class TrainOptions:
    expdir: str = "runs"
    tag: str = ""
    device: str | None = None
    quiet: bool = False
    tensorboard: int = 1
    disable: Sequence[str] = ()


@dataclass
class Progress:
    epoch: int = 0  # completed epochs
    episode: int = 0  # batches trained on
    batch_in_epoch: int = 0
    wall_time: float = 0.0  # seconds, summed over resumed sessions

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
        return self.progress.wall_time + time.perf_counter() - self.session_started

    def running_state(self) -> dict[str, Any]:
        return {
            "epoch_loss": self.epoch_loss.state_dict(),
            "interval_loss": self.interval_loss.state_dict(),
            "interval_samples": self.interval_samples,
            "train_statistics": {n: s.state_dict() for n, s in self.train_statistics.items()},
            "latest": self.latest,
        }

    def restore(self, checkpoint: dict[str, Any]) -> None:
        for name, component in self.pipeline.components.items():
            component.load_state_dict(checkpoint["components"][name])
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
        self.latest = running["latest"]
        restore_rng_state(checkpoint["rng"])

    def close(self) -> None:
        self.reporter.close()
        close_logger(self.log)


def _section_loader(
    section: str,
    pipeline: Pipeline,
    sections: dict[str, Any],
    seed: int,
    where: Any,
    device: torch.device,
) -> SectionLoader | None:
    if section not in pipeline.tasks:
        return None
    return SectionLoader(
        section,
        pipeline.tasks[section],
        sections[section],
        seed,
        where,
        pin_memory=device.type == "cuda",
    )


def prepare_training(
    config: str | Path | None,
    overrides: Sequence[str],
    options: TrainOptions,
    resume: str | Path | None = None,
) -> RunState:
    checkpoint = None
    if resume is not None:
        run_dir = Path(resume).expanduser()
        if overrides or config is not None:
            raise ConfigError(
                [
                    Problem(
                        "command line",
                        "--resume",
                        "continues a run exactly as it was configured: give no config or overrides",
                    )
                ]
            )
        checkpoint = load_checkpoint(run_dir / "checkpoints" / "last.pt")
        config = run_dir / "config.yaml"
    assert config is not None
    loaded, sections = load_and_validate(config, overrides)
    training = sections.get("training")
    if not isinstance(training, TrainingConfig):
        raise ConfigError(
            [
                Problem(
                    loaded.where(),
                    "section 'training'",
                    "is required to train",
                    "add a training section with a task",
                )
            ]
        )
    limits = training.terminal_conditions
    if limits.epoch_limit is None and limits.episode_limit is None:
        raise ConfigError(
            [
                Problem(
                    loaded.where("training", "terminal_conditions"),
                    "training.terminal_conditions",
                    "sets no epoch_limit or episode_limit, so the run would never end",
                    "add e.g. `epoch_limit: 10`",
                )
            ]
        )
    seed = training.seed if training.seed is not None else secrets.randbelow(2**31)
    loaded.data["training"]["seed"] = seed  # recorded, so config.yaml reproduces the run
    seed_everything(seed)
    set_deterministic(training.deterministic)
    pipeline = build_checked(loaded, options.disable)
    device = resolve_device(options.device)
    name = pipeline_name(loaded)
    if resume is not None:
        run_dir = Path(resume).expanduser()
    else:
        run_dir = create_run_folder(options.expdir, name, options.tag)
        if options.disable:
            disabled = loaded.data.setdefault("pipeline", {}).get("disable") or []
            loaded.data["pipeline"]["disable"] = [*disabled, *options.disable]
        header = "".join(f"# override: {o}\n" for o in overrides)
        write_text_atomic(run_dir / "config.yaml", header + dump_config(loaded.data))
    log = make_logger(run_dir, options.quiet)
    pipeline.to(device)
    validation = sections.get("validation")
    optimizer = build_optimizer(training.optimizer.model_dump(), pipeline, loaded.where)
    train_data = _section_loader("training", pipeline, sections, seed, loaded.where, device)
    assert train_data is not None, "the pipeline builder builds the training task"
    state = RunState(
        name=name,
        config=training,
        run_dir=run_dir,
        device=device,
        seed=seed,
        pipeline=pipeline,
        train_data=train_data,
        validation_data=_section_loader(
            "validation", pipeline, sections, seed, loaded.where, device
        ),
        validation_config=validation if isinstance(validation, ValidationConfig) else None,
        test_data=_section_loader("test", pipeline, sections, seed, loaded.where, device),
        optimizer=optimizer,
        scheduler=build_scheduler(
            training.scheduler.model_dump() if training.scheduler else None, optimizer, loaded.where
        ),
        precision=Precision(
            training.precision, device, *(_clipping(training) if training.gradient_clipping else ())
        ),
        loss=WeightedLoss(pipeline, training.loss_weights, loaded.where),
        guard=DivergenceGuard(device, [loss.stream_name("loss") for loss in pipeline.losses]),
        reporter=Reporter(
            run_dir,
            log,
            options.tensorboard,
            checkpoint["progress"]["episode"] if checkpoint else None,
        ),
        log=log,
        monitor=make_monitor(limits, "validation" in pipeline.tasks),
        signals=StopSignals(),
        show_progress=not options.quiet,
        train_statistics=statistics_copy(pipeline, device),
        validation_statistics=statistics_copy(pipeline, device),
    )
    if checkpoint is not None:
        state.restore(checkpoint)
        log.info("resumed from episode %d (epoch %d)", state.progress.episode, state.progress.epoch)
    return state


def _clipping(training: TrainingConfig) -> tuple[float | None, float | None, float]:
    clip = training.gradient_clipping
    assert clip is not None
    return clip.norm, clip.value, clip.norm_type
