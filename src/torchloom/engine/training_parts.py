"""The parts of training a config describes besides the pipeline: optimizer, scheduler,
weighted loss, monitor, torch.compile options. Built (and so checked) without reading data,
by `loom check` and by `loom train` alike, collecting every problem into one error."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from torchloom.config.schema import TrainingConfig
from torchloom.core.pipeline import Pipeline
from torchloom.engine.compilation import compile_options
from torchloom.engine.evaluation import statistic_names
from torchloom.engine.losses import WeightedLoss
from torchloom.engine.optim import build_optimizer, build_scheduler
from torchloom.engine.terminal import Monitor, check_monitor, make_monitor
from torchloom.errors import ConfigError, LoomError, Problem


@dataclass
class TrainingParts:
    optimizer: torch.optim.Optimizer
    scheduler: Any
    loss: WeightedLoss
    monitor: Monitor
    compile_options: dict[str, Any] | None  # for torch.compile; None: eager


def check_limits(training: TrainingConfig, where: Callable[..., str]) -> list[Problem]:
    limits = training.terminal_conditions
    if limits.epoch_limit is None and limits.episode_limit is None:
        return [
            Problem(
                where("training", "terminal_conditions"),
                "training.terminal_conditions",
                "sets no epoch_limit or episode_limit, so the run would never end",
                "add e.g. `epoch_limit: 10`",
            )
        ]
    return []


def build_training_parts(
    pipeline: Pipeline, training: TrainingConfig, where: Callable[..., str]
) -> TrainingParts:
    problems = check_limits(training, where)
    optimizer = scheduler = loss = compiling = None
    try:
        compiling = compile_options(training.compile, where)
    except LoomError as error:
        problems += error.problems
    try:
        optimizer = build_optimizer(training.optimizer.model_dump(), pipeline, where)
        scheduler = build_scheduler(
            training.scheduler.model_dump() if training.scheduler else None, optimizer, where
        )
    except LoomError as error:
        problems += error.problems
    try:
        loss = WeightedLoss(pipeline, training.loss_weights, where)
    except LoomError as error:
        problems += error.problems
    has_validation = "validation" in pipeline.tasks
    monitor = make_monitor(training.terminal_conditions, has_validation)
    if loss is not None:
        sections = ["training", *(["validation"] if has_validation else [])]
        try:
            check_monitor(
                monitor,
                statistic_names(pipeline, loss, sections),
                where("training", "terminal_conditions", "early_stopping", "monitor"),
            )
        except LoomError as error:
            problems += error.problems
    if problems:
        raise ConfigError(problems)
    assert optimizer is not None and loss is not None
    return TrainingParts(optimizer, scheduler, loss, monitor, compiling)
