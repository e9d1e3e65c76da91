"""One pass over a section in eval mode: validation, test, `loom process`."""

from __future__ import annotations

import copy
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from torchloom.core.component import Batch, Statistic
from torchloom.core.pipeline import Pipeline
from torchloom.engine.loaders import to_device
from torchloom.engine.step import Precision, WeightedLoss, batch_size_of
from torchloom.statistics.accumulators import RunningStats


def statistics_copy(pipeline: Pipeline, device: torch.device) -> dict[str, Statistic]:
    """Fresh copies of the pipeline's statistics, one set per section, on the device."""
    copies = {}
    for statistic in pipeline.statistics:
        clone = copy.deepcopy(statistic)
        clone.ready()  # made now, so a checkpoint's running counts can be restored into it
        clone = clone.to(device)
        clone.reset()
        copies[statistic.name] = clone
        # torchmetrics is imported by the statistics that use it, not here: importing it costs
        # seconds (it pulls in torchvision and torch._dynamo). No such statistic, no Metric.
        metrics = sys.modules.get("torchmetrics")
        if metrics is None:
            continue
        for module in clone.modules():
            if isinstance(module, metrics.Metric):
                module.persistent(True)  # running counts go into checkpoints: exact resume
    return copies


class TrainingStatistics:
    """The training statistics over the epoch so far and over the logging interval so far
    (they end at different steps: an interval may span two epochs). A statistic that can
    merge (`Statistic.merge`) counts each step once, into a pending copy that is added to
    both at every row; one that cannot counts into both every step."""

    def __init__(self, pipeline: Pipeline, device: torch.device) -> None:
        self.pipeline = pipeline
        self.epoch = statistics_copy(pipeline, device)
        self.interval = statistics_copy(pipeline, device)
        pending = statistics_copy(pipeline, device)
        self.pending = {name: s for name, s in pending.items() if s.can_merge}
        # What each step updates: the pending copies, or both totals of the others.
        self._first = {name: self.pending.get(name, s) for name, s in self.epoch.items()}
        self._second = {n: s for n, s in self.interval.items() if n not in self.pending}

    def update(self, batch: Batch) -> None:
        self.pipeline.update_statistics(batch, self._first)
        if self._second:
            self.pipeline.update_statistics(batch, self._second)

    def _fold(self) -> None:
        for name, pending in self.pending.items():
            self.epoch[name].merge(pending)
            self.interval[name].merge(pending)
            pending.reset()

    def interval_values(self) -> dict[str, float]:
        """The interval's values; the interval starts again."""
        self._fold()
        values = statistic_values(self.interval)
        for statistic in self.interval.values():
            statistic.reset()
        return values

    def epoch_values(self) -> dict[str, float]:
        """The epoch's values, which keep counting until `end_epoch`."""
        self._fold()
        return statistic_values(self.epoch)

    def end_epoch(self) -> None:
        for statistic in self.epoch.values():
            statistic.reset()

    def state_dict(self) -> dict[str, Any]:
        self._fold()  # exact integer sums: folding early changes no value
        return {
            "train_statistics": {n: s.state_dict() for n, s in self.epoch.items()},
            "interval_statistics": {n: s.state_dict() for n, s in self.interval.items()},
        }

    def load_state_dict(self, running: Mapping[str, Any]) -> None:
        for name, statistic in self.epoch.items():
            statistic.load_state_dict(running["train_statistics"][name])
        for name, state in running.get("interval_statistics", {}).items():
            self.interval[name].load_state_dict(state)


def statistic_values(statistics: Mapping[str, Statistic]) -> dict[str, float]:
    """Set-level values by name; a name two statistics share is prefixed with the component."""
    computed = {name: s.compute() for name, s in statistics.items()}
    counts: dict[str, int] = {}
    for values in computed.values():
        for key in values:
            counts[key] = counts.get(key, 0) + 1
    return {
        (key if counts[key] == 1 else f"{name}.{key}"): value
        for name, values in computed.items()
        for key, value in values.items()
    }


class PassInterrupted(Exception):
    """A signal asked an evaluation pass to stop (the final test pass: nothing to save)."""


def evaluate(
    pipeline: Pipeline,
    batches: Iterable[Batch],
    statistics: Mapping[str, Statistic],
    loss: WeightedLoss | None,
    precision: Precision,
    device: torch.device,
    max_batches: int | None = None,
    observe: Callable[[Batch], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> dict[str, float]:
    """Eval mode, no gradients; everything over the whole pass, never a mean of batch values:
    `loss` is the mean over samples (each batch's mean loss weighted by its size), with
    `loss_min/max/std` over batches; statistics come from their set-level counts. `stop`,
    asked before each batch, ends the pass with PassInterrupted when it says so."""
    was_training = pipeline.training
    pipeline.eval()
    for statistic in statistics.values():
        statistic.reset()
    # "loss" is the weighted total; each loss's own stream is reported too when there are several
    streams = ["loss", *(loss.streams if loss and len(loss.streams) > 1 else [])]
    per_batch = {name: RunningStats() for name in streams}
    weighted: dict[str, torch.Tensor] = {}
    samples = 0
    with torch.no_grad():
        for index, batch in enumerate(batches):
            if max_batches is not None and index >= max_batches:
                break
            if stop is not None and stop():
                pipeline.train(was_training)
                raise PassInterrupted
            batch = to_device(batch, device)
            with precision.autocast():
                pipeline(batch)
                total = loss(batch) if loss is not None else None
            size = batch_size_of(batch)
            for name in streams:
                if total is None:
                    break
                value = (total if name == "loss" else batch[name]).detach().to(torch.float64)
                per_batch[name].add(value)
                weighted[name] = weighted.get(name, 0) + value * size
            pipeline.update_statistics(batch, statistics)
            if observe is not None:
                observe(batch)  # hooks: per-sample analysis of the pass
            samples += size
    pipeline.train(was_training)
    values: dict[str, float] = {}
    for name in streams if weighted else ():
        values.update(per_batch[name].values(name))
        values[name] = float(weighted[name]) / max(samples, 1)
    values.update(statistic_values(statistics))
    values["samples"] = samples
    return values


def statistic_names(pipeline: Pipeline, loss: WeightedLoss, sections: Iterable[str]) -> set[str]:
    """Every `section.name` a run reports, known before any data is read (the statistics are
    asked for their values while empty, and never made ready: `loom check` imports no
    torchmetrics). Empty when a statistic cannot answer that early."""
    keys = {"loss", "samples", *(loss.streams if len(loss.streams) > 1 else [])}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fresh = {s.name: copy.deepcopy(s) for s in pipeline.statistics}
            for statistic in fresh.values():
                statistic.reset()
            keys |= set(statistic_values(fresh))
    except Exception:  # a third-party statistic that cannot compute while empty
        return set()
    return {f"{section}.{key}" for section in sections for key in keys}
