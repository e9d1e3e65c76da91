"""When a run stops, and which checkpoint is best.

One `Monitor` follows a statistic ("validation.accuracy", "training.loss", ...): it decides
what `best.pt` is and, with a patience, early stopping. Reasons a run ends are the statuses
written to summary.json.
"""

from __future__ import annotations

import math
from typing import Any

from torchloom.config.schema import TerminalConditions
from torchloom.engine.run_folder import Status
from torchloom.errors import ConfigError, did_you_mean


class Monitor:
    def __init__(
        self, name: str, mode: str, patience: int | None = None, min_delta: float = 0.0
    ) -> None:
        self.name, self.mode, self.patience, self.min_delta = name, mode, patience, min_delta
        self.best: float | None = None
        self.best_epoch: int | None = None
        self.bad_evaluations = 0

    def is_better(self, value: float) -> bool:
        if math.isnan(value):
            return False
        if self.best is None:
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def update(self, statistics: dict[str, float], epoch: int) -> bool:
        """Record one evaluation; returns whether it is the best so far."""
        if self.name not in statistics:
            raise ConfigError.at(
                "",
                f"monitor '{self.name}'",
                "is not a statistic of this run",
                did_you_mean(self.name, statistics)
                or f"statistics: {', '.join(sorted(statistics))}",
            )
        value = statistics[self.name]
        if self.is_better(value):
            self.best, self.best_epoch, self.bad_evaluations = value, epoch, 0
            return True
        self.bad_evaluations += 1
        return False

    @property
    def exhausted(self) -> bool:
        return self.patience is not None and self.bad_evaluations > self.patience

    def state_dict(self) -> dict[str, Any]:
        return {
            "best": self.best,
            "best_epoch": self.best_epoch,
            "bad_evaluations": self.bad_evaluations,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_epoch = state["best"], state["best_epoch"]
        self.bad_evaluations = state["bad_evaluations"]


def check_monitor(monitor: Monitor, names: set[str], where: str) -> None:
    """Fail before training, not after the first epoch, when the monitor names no statistic."""
    if names and monitor.name not in names:
        raise ConfigError.at(
            where,
            f"monitor '{monitor.name}'",
            "is not a statistic of this pipeline",
            did_you_mean(monitor.name, names) or f"statistics: {', '.join(sorted(names))}",
        )


def make_monitor(conditions: TerminalConditions, has_validation: bool) -> Monitor:
    stopping = conditions.early_stopping
    if stopping is not None:
        return Monitor(stopping.monitor, stopping.mode, stopping.patience, stopping.min_delta)
    return Monitor("validation.loss" if has_validation else "training.loss", "min")


def limit_inside_a_window(
    conditions: TerminalConditions, batches_per_epoch: int, accumulation: int
) -> str | None:
    """What to tell when `episode_limit` ends the run inside a gradient-accumulation window:
    that window's batches are trained on but not stepped. They are kept (last.pt holds their
    gradients), so that a resume with a higher limit applies them."""
    limit = conditions.episode_limit
    if limit is None or accumulation == 1 or batches_per_epoch <= 0:
        return None
    epochs = conditions.epoch_limit
    if epochs is not None and limit >= epochs * batches_per_epoch:
        return None  # the epoch limit comes first, at an epoch's end
    left = limit % batches_per_epoch % accumulation
    if not left:
        return None
    return (
        f"episode_limit {limit} ends the run {left} batch(es) into a gradient_accumulation "
        f"window of {accumulation}: they are not in the final weights (last.pt keeps their "
        "gradients: a resume with a higher limit applies them)"
    )


def limit_reached(conditions: TerminalConditions, epoch: int, episode: int) -> Status | None:
    """EPOCH_LIMIT / EPISODE_LIMIT once a limit is reached (epoch counts completed epochs)."""
    if conditions.episode_limit is not None and episode >= conditions.episode_limit:
        return Status.EPISODE_LIMIT
    if conditions.epoch_limit is not None and epoch >= conditions.epoch_limit:
        return Status.EPOCH_LIMIT
    return None


def judged_end(
    conditions: TerminalConditions, statistics: dict[str, float], validated: bool, monitor: Monitor
) -> Status | None:
    """The end an evaluation's statistics give (after the monitor took them): convergence,
    then early stopping; None to go on."""
    if converged(conditions, statistics, validated):
        return Status.CONVERGED
    return Status.EARLY_STOPPED if monitor.exhausted else None


def resumed_end(conditions: TerminalConditions, progress: Any, monitor: Monitor) -> Status | None:
    """How the loop starts from where a run stands (a resumed run's checkpoint): nothing to
    end when its last step's after-step work is still to do (`Progress.step_settled`); the end
    a judged evaluation gave (a run stopped in its final test pass: early stopping's only if
    the patience it has now runs out too); else a limit reached."""
    if not progress.step_settled:
        return None
    if progress.judged == Status.CONVERGED.value:
        return Status.CONVERGED
    if progress.judged == Status.EARLY_STOPPED.value and monitor.exhausted:
        return Status.EARLY_STOPPED
    return limit_reached(conditions, progress.epoch, progress.episode)


def converged(
    conditions: TerminalConditions, statistics: dict[str, float], has_validation: bool
) -> bool:
    threshold = conditions.loss_stop_threshold
    key = "validation.loss" if has_validation else "training.loss"
    return threshold is not None and key in statistics and statistics[key] < threshold
