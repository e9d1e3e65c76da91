"""One trial: a full training run through the public training API (`prepare_training`),
in its own run folder under the search folder, with a hook that reports the monitored
statistic to Optuna after every validation and stops the run when the pruner says so.

A trial ends in one of four ways, each recorded with its reason by the worker:
complete (the best value of the monitor), pruned (TrialPruned), failed (a user error in the
sampled config, a diverged loss, a crash: TrialFailed), or interrupted (Ctrl-C / SIGTERM:
KeyboardInterrupt, which ends the search)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchloom.api import Hook, RunResult, RunView, TrainOptions, failure_reason, prepare_training
from torchloom.config.loading import ConfigSource
from torchloom.errors import LoomError
from torchloom.search.pareto import ParameterCount
from torchloom.signals import stop_asked

if TYPE_CHECKING:
    import optuna


class TrialFailed(Exception):
    """A trial that could not give a value; `reason` is one line for trials.csv."""

    def __init__(self, reason: str, run_dir: Path | None = None) -> None:
        super().__init__(reason)
        self.reason, self.run_dir = reason, run_dir


class DeviceFailed(TrialFailed):
    """A trial whose GPU failed (a device-side assert, an illegal memory access): the process's
    CUDA context is unusable from then on, so every later trial of its worker would fail."""


class DeviceUnusable(LoomError):
    headline = "search worker stopped"


class Pruned(Exception):
    def __init__(self, reason: str, run_dir: Path | None) -> None:
        super().__init__(reason)
        self.reason, self.run_dir = reason, run_dir


@dataclass(frozen=True)
class Objective:
    """The monitored statistic: `section.name` and whether higher is better."""

    monitor: str
    mode: str

    @property
    def section(self) -> str:
        return self.monitor.split(".", 1)[0]

    @property
    def name(self) -> str:
        return self.monitor.split(".", 1)[1]

    def better(self, value: float, best: float | None) -> bool:
        if math.isnan(value):
            return False
        return best is None or (value > best if self.mode == "max" else value < best)


class PruningReporter(Hook):
    """Reports the monitor after each full validation (step: completed epochs) or, in online
    mode, after every validation (step: episodes), and asks the run to stop when pruned."""

    name = "search_pruning"

    def __init__(self, trial: optuna.trial.Trial, objective: Objective) -> None:
        self.trial, self.objective = trial, objective
        self.best: float | None = None
        self.full: float | None = None  # an online run's full validation pass, at its end
        self.pruned_at: int | None = None
        self.reported: set[int] = set()

    def value(self) -> float | None:
        """The trial's value: its best validation; an online run's full pass at its end (on
        the whole set, as `loom runs` ranks online runs): its partial passes, a few batches
        each, judge pruning only, so that no trial wins on one lucky partial pass."""
        return self.full if self.full is not None else self.best

    def after_training_epoch(self, run: RunView, values: dict[str, Any]) -> None:
        if self.objective.section == "training":
            self._observe(run, values, run.progress.epoch)

    def after_eval(self, run: RunView, section: str, values: dict[str, Any], partial: bool) -> None:
        if section != self.objective.section or section == "test":
            return
        if partial and not run.online:
            return
        step = run.progress.episode if run.online else run.progress.epoch
        value = values.get(self.objective.name)
        if run.online and not partial and isinstance(value, int | float):
            self.full = float(value)
        self._observe(run, values, step)

    def _observe(self, run: RunView, values: Mapping[str, Any], step: int) -> None:
        value = values.get(self.objective.name)
        if not isinstance(value, int | float):
            return
        value = float(value)
        if self.objective.better(value, self.best):
            self.best = value
        # Online, a full validation can come at the episode of the partial one just told:
        # Optuna keeps a step's first value and warns at a second.
        if math.isfinite(value) and step not in self.reported:
            self.trial.report(value, step)
            self.reported.add(step)
        if self.pruned_at is None and self.trial.should_prune():
            self.pruned_at = step
            run.log.info("search: trial %d pruned at step %d", self.trial.number, step)
            run.request_stop(f"pruned by the search at step {step}")


def run_trial(
    trial: optuna.trial.Trial,
    config: ConfigSource,
    overrides: Sequence[str],
    objective: Objective,
    options: TrainOptions,
    on_run_dir: Callable[[Path], None] | None = None,
) -> tuple[float, RunResult]:
    """Train one sampled config; (the monitor's best value, the run) or Pruned/TrialFailed;
    KeyboardInterrupt when the run was stopped by a signal."""
    reporter = PruningReporter(trial, objective)
    options = replace(options, hooks=[*options.hooks, reporter, ParameterCount(trial)])
    run_dir: Path | None = None
    try:
        prepared = prepare_training(config, overrides, options)
        if isinstance(prepared, RunResult):  # not for a new run; kept total
            raise TrialFailed("the run had nothing to do", prepared.run_dir)
        run_dir = prepared.setup.run_dir
        if on_run_dir is not None:
            on_run_dir(run_dir)
        result = prepared.run()
        # A signal that came during the last validation or the test pass finds no step left
        # to stop at: the run ends as if none came. The search stops all the same.
        signalled = prepared.setup.signals.by_signal
    except (KeyboardInterrupt, TrialFailed):
        raise
    except Exception as error:
        if stop_asked():  # the interrupt, turned into another error by what it cut short
            raise KeyboardInterrupt from error
        if _device_failed(error):  # before a LoomError: the run may have wrapped it
            raise DeviceFailed(f"crashed: {failure_reason(error)}", run_dir) from error
        if isinstance(error, LoomError):
            raise TrialFailed(failure_reason(error), run_dir) from error
        # A crash in one trial never ends the study.
        raise TrialFailed(f"crashed: {failure_reason(error)}", run_dir) from error
    # Pruned after the last step, the run ended by its own limit all the same (its test pass
    # and pictures done): complete, with its value.
    if reporter.pruned_at is not None and result.status == "stopped":
        raise Pruned(f"pruned at step {reporter.pruned_at}", result.run_dir)
    if result.status == "interrupted" or signalled:
        raise KeyboardInterrupt
    if result.status == "failed":
        raise TrialFailed(str(result.summary.get("reason", "failed")), result.run_dir)
    value = reporter.value()
    if value is None:
        value = _final_value(result, objective)
    if value is None or not math.isfinite(value):
        raise TrialFailed(
            f"no finite value of {objective.monitor} ({result.summary.get('reason')})",
            result.run_dir,
        )
    return value, result


def _device_failed(error: BaseException) -> bool:
    """Whether `error` (or what it was made from) is torch's accelerator error and the GPU no
    longer answers: some such errors (an oversized launch) leave the process's CUDA context
    usable, a device-side assert or an illegal memory access does not."""
    seen: BaseException | None = error
    while seen is not None and not _accelerator_error(seen):
        seen = seen.__cause__ or seen.__context__
    return seen is not None and not gpu_answers()


def _accelerator_error(error: BaseException) -> bool:
    import torch

    kind = getattr(torch, "AcceleratorError", None)  # torch 2.8 and later
    if kind is not None:
        return isinstance(error, kind)
    return isinstance(error, RuntimeError) and "CUDA error" in str(error)  # as torch said it


def gpu_answers() -> bool:
    """Whether this process's accelerator (a GPU) still runs a kernel and synchronises."""
    import torch

    accelerator = getattr(torch, "accelerator", None)  # torch 2.6 and later; before, CUDA's
    if accelerator is None or not hasattr(accelerator, "synchronize"):
        device, available, synchronize = "cuda", torch.cuda.is_available, torch.cuda.synchronize
    else:
        device, available = accelerator.current_accelerator(), accelerator.is_available
        synchronize = accelerator.synchronize
    if not available():
        return True  # nothing there to have broken
    try:
        torch.ones(1, device=device).add_(1)
        synchronize()
    except Exception:
        return False
    return True


def _final_value(result: RunResult, objective: Objective) -> float | None:
    value = result.statistics.get(objective.section, {}).get(objective.name)
    return float(value) if isinstance(value, int | float) else None
