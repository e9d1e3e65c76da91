"""The parts of a training run a config describes besides the pipeline: optimizer,
scheduler, weighted loss, monitor and torch.compile options. Built, and so checked, without
reading data: `loom check`, `loom lr-find` and the run's set-up (engine/setup.py) share them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from torchloom.config.schema import TrainingConfig
from torchloom.core.pipeline import Pipeline
from torchloom.engine.architecture_search import check_search
from torchloom.engine.evaluation import statistic_names
from torchloom.engine.optim import build_optimizer, build_scheduler
from torchloom.engine.step import WeightedLoss, compile_options, replays_cuda_graphs
from torchloom.engine.terminal import Monitor, check_monitor, make_monitor
from torchloom.errors import ConfigError, LoomError, Problem, Where


@dataclass
class TrainingParts:
    """Optimizer, scheduler, weighted loss, monitor, torch.compile options: built (and so
    checked) without reading data, by `loom check` and `loom train` alike."""

    optimizer: torch.optim.Optimizer
    scheduler: Any
    loss: WeightedLoss
    monitor: Monitor
    compile_options: dict[str, Any] | None  # for torch.compile; None: eager


def build_training_parts(
    pipeline: Pipeline, training: TrainingConfig, where: Where
) -> TrainingParts:
    """Every part, collecting every problem into one error."""
    problems: list[Problem] = []
    limits = training.terminal_conditions
    if limits.epoch_limit is None and limits.episode_limit is None:
        problems.append(
            Problem(
                where("training", "terminal_conditions"),
                "training.terminal_conditions",
                "sets no epoch_limit or episode_limit, so the run would never end",
                "add e.g. `epoch_limit: 10`",
            )
        )
    optimizer = scheduler = loss = compiling = None
    try:
        compiling = compile_options(training.compile, where)
    except LoomError as error:
        problems += error.problems
    if (
        compiling is not None
        and replays_cuda_graphs(compiling)
        and training.gradient_accumulation > 1
    ):
        # The first micro-batch's gradients are taken over from the CUDA graphs' memory,
        # which the next micro-batch's graphs write again (pytorch#169545): a crash, or
        # gradients silently wrong.
        problems.append(
            Problem(
                where("training", "gradient_accumulation"),
                "training.gradient_accumulation",
                f"is {training.gradient_accumulation}: the CUDA graphs that training.compile "
                f"{dict(compiling)} replays on a GPU do not accumulate gradients correctly",
                "accumulate with `compile: true` or `{mode: max-autotune-no-cudagraphs}`, "
                "or use a larger batch without accumulation",
            )
        )
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
        names = statistic_names(pipeline, loss, sections)
        monitor_key = where("training", "terminal_conditions", "early_stopping", "monitor")
        try:
            check_monitor(monitor, names, monitor_key)
        except LoomError as error:
            problems += error.problems
    problems += check_search(pipeline, training, where)
    if problems:
        raise ConfigError(problems)
    assert optimizer is not None and loss is not None
    return TrainingParts(optimizer, scheduler, loss, monitor, compiling)
