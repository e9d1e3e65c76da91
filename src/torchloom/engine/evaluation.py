"""One pass over a section in eval mode: validation, test, `loom process`."""

from __future__ import annotations

import copy
import itertools
import math
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from torchloom.core.component import Batch, Statistic
from torchloom.core.pipeline import Pipeline
from torchloom.engine.distributed import SINGLE, Distributed
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
        clone.count_persistently()  # running counts go into checkpoints: exact resume
        copies[statistic.name] = clone
    return copies


class TrainingStatistics:
    """The training statistics over the epoch so far and over the logging interval so far
    (they end at different steps: an interval may span two epochs). A statistic that can
    merge (`Statistic.merge`) counts each step once, into a pending copy that is added to
    both at every row; one that cannot counts into both every step. With several
    processes each counts its share; rows and checkpoints read the counts of all."""

    def __init__(
        self, pipeline: Pipeline, device: torch.device, distributed: Distributed = SINGLE
    ) -> None:
        self.pipeline, self.distributed, self.device = pipeline, distributed, device
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

    def _of_all(self, statistics: dict[str, Statistic]) -> dict[str, Statistic]:
        """The counts of every process (copies; this process keeps counting its own)."""
        if not self.distributed.active:
            return statistics
        copies = {name: copy.deepcopy(statistic) for name, statistic in statistics.items()}
        combine(copies, self.distributed, self.device)
        return copies

    def interval_values(self) -> dict[str, float]:
        """The interval's values; the interval starts again."""
        self._fold()
        values = statistic_values(self._of_all(self.interval))
        for statistic in self.interval.values():
            statistic.reset()
        return values

    def epoch_values(self) -> dict[str, float]:
        """The epoch's values, which keep counting until `end_epoch`."""
        self._fold()
        return statistic_values(self._of_all(self.epoch))

    def end_epoch(self) -> None:
        for statistic in self.epoch.values():
            statistic.reset()

    def state_dict(self) -> dict[str, Any]:
        """The counts of every process (a checkpoint is the run's, whatever the world size)."""
        self._fold()  # exact integer sums: folding early changes no value
        epoch, interval = self._of_all(self.epoch), self._of_all(self.interval)
        return {
            "train_statistics": {n: _on_cpu(s.state_dict()) for n, s in epoch.items()},
            "interval_statistics": {n: _on_cpu(s.state_dict()) for n, s in interval.items()},
        }

    def load_state_dict(self, running: Mapping[str, Any]) -> None:
        """The run's counts go to rank 0 (the others start from none, so the sum is right)."""
        if not self.distributed.main:
            return
        for name, statistic in self.epoch.items():
            _load(statistic, running["train_statistics"][name], self.device)
        for name, state in running.get("interval_statistics", {}).items():
            _load(self.interval[name], state, self.device)


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
    distributed: Distributed = SINGLE,
) -> dict[str, float]:
    """Eval mode, no gradients; everything over the whole pass, never a mean of batch values:
    `loss` is the mean over what it averages (each batch's mean loss weighted by its samples,
    or for a loss that says so, by its counted elements: a sequence loss's steps; see
    `WeightedLoss.elements`), so a set's loss does not depend on how it is batched, with
    `loss_min/max/std` over batches; statistics come from their set-level counts. `stop`,
    asked before each batch, ends the pass with PassInterrupted when it says so (with several
    processes, on every process at the same batch: `_stop_together`). With
    several processes, each evaluates its share of the set (`batches`: its share of each
    batch) and the values are the set's: sums added, statistics merged, and
    `loss_min/max/std` over the batches' means, as one process computes them."""
    was_training = pipeline.training
    pipeline.eval()
    for statistic in statistics.values():
        statistic.reset()
    # "loss" is the weighted total; each loss's own stream is reported too when there are several
    streams = ["loss", *(loss.streams if loss and len(loss.streams) > 1 else [])]
    per_batch = {name: RunningStats() for name in streams}
    # Per stream: the sum of each batch's loss times its weight, and of the weights (tensors
    # on the device: read once, at the end).
    sums: dict[str, Sum] = {}
    # With several processes: this process's share of each batch (its size and sums), from
    # which the batches' own means are made once every process's shares are known.
    shares: list[tuple[int, dict[str, Sum]]] = []
    samples = 0
    if stop is not None and distributed.active:
        stop = _stop_together(stop, batches, distributed)
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
            share: dict[str, Sum] = {}
            weights = loss.elements(batch, size) if loss is not None else {}
            for name, weight in weights.items():
                assert total is not None  # a loss gives a total
                value = (total if name == "loss" else batch[name]).detach().to(torch.float64)
                part = value * weight
                if torch.is_tensor(weight):  # a batch that counts nothing has a NaN mean
                    part = torch.where(weight > 0, part, 0.0)
                before = sums.get(name, (0, 0))
                sums[name] = (before[0] + part, before[1] + weight)
                if distributed.active:
                    share[name] = (part, weight)
                else:
                    per_batch[name].add(value)
            if distributed.active:
                shares.append((size, share))
            pipeline.update_statistics(batch, statistics)
            if observe is not None:
                observe(batch)  # hooks: per-sample analysis of the pass
            samples += size
    pipeline.train(was_training)
    if distributed.active:
        samples, sums = _sums_of_all(distributed, samples, sums, shares, per_batch)
        combine(statistics, distributed, device)
    values: dict[str, float] = {}
    for name in streams if sums else ():
        values.update(per_batch[name].values(name))
        loss_sum, weight_sum = (float(part) for part in sums[name])
        values[name] = loss_sum / weight_sum if weight_sum else math.nan
    values.update(statistic_values(statistics))
    values["samples"] = samples
    return values


def _stop_together(
    stop: Callable[[], bool], batches: Iterable[Batch], distributed: Distributed
) -> Callable[[], bool] | None:
    """`stop` asked of every process at the same batches, true on all when it is on one (a
    signal may reach one process alone): before each batch of the shortest share, since a
    process may have one share fewer (each question is a collective every process must
    ask). None where a share's length is not known: that pass stops only at its end."""
    try:
        mine: int | None = len(batches)  # type: ignore[arg-type]
    except TypeError:
        mine = None
    lengths = distributed.gather(mine)
    if None in lengths:
        return None
    common = min(lengths)
    asked = itertools.count()
    return lambda: next(asked) < common and distributed.agree(stop())


# A loss stream's running (sum of loss x weight, sum of weights): tensors or numbers.
Sum = tuple[Any, Any]


def _sums_of_all(
    distributed: Distributed,
    samples: int,
    sums: dict[str, Sum],
    shares: list[tuple[int, dict[str, Sum]]],
    per_batch: dict[str, RunningStats],
) -> tuple[int, dict[str, Sum]]:
    """Every process's samples and loss sums, added; `per_batch` filled with each batch's
    mean loss (the k-th share of every process is a part of the k-th batch, and a process
    may have one share fewer: the last batch had less samples than processes)."""

    def plain(pair: Sum) -> tuple[float, float]:
        return float(pair[0]), float(pair[1])

    mine = [(size, {k: plain(v) for k, v in share.items()}) for size, share in shares]
    gathered = distributed.gather((samples, {k: plain(v) for k, v in sums.items()}, mine))
    total = sum(count for count, _, _ in gathered)
    names = {name for part in gathered for name in part[1]}  # none from a process without data
    added = {
        name: tuple(sum(part[1].get(name, (0.0, 0.0))[i] for part in gathered) for i in (0, 1))
        for name in names
    }
    for index in range(max(len(part[2]) for part in gathered)):
        parts = [part[2][index] for part in gathered if index < len(part[2])]
        for name in per_batch:
            pairs = [share[name] for _, share in parts if name in share]
            weight = sum(w for _, w in pairs)
            value = sum(v for v, _ in pairs) / weight if weight else math.nan
            per_batch[name].add(torch.tensor(value, dtype=torch.float64))
    return total, added


def combine(
    statistics: Mapping[str, Statistic], distributed: Distributed, device: torch.device
) -> None:
    """Each statistic made the set's: every other process's counts merged into it."""
    if not distributed.active:
        return
    states = distributed.gather(
        {name: _on_cpu(statistic.state_dict()) for name, statistic in statistics.items()}
    )
    for rank, state in enumerate(states):
        if rank == distributed.rank:
            continue
        for name, statistic in statistics.items():
            other = copy.deepcopy(statistic)
            _load(other, state[name], device)
            statistic.merge(other)


def _load(statistic: Statistic, state: Mapping[str, Any], device: torch.device) -> None:
    """Counts read on the host into a statistic on `device`: a torchmetrics metric inside
    takes the loaded tensors as they are (it swaps its states for them, where a module's
    buffers copy them in), so it is moved back to the device."""
    statistic.load_state_dict(state)
    statistic.to(device)


def _on_cpu(state: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def statistic_names(pipeline: Pipeline, loss: WeightedLoss, sections: Iterable[str]) -> set[str]:
    """Every `section.name` a run reports, as its rows name them, known before any data is
    read (the statistics are asked for their values while empty, and never made ready:
    `loom check` imports no torchmetrics). Empty when a statistic cannot answer that early.
    Training rows have the loss over batches and the rate; evaluation rows the samples and,
    with several losses, each one's."""
    spread = ("", "_min", "_max", "_std")
    losses = ["loss", *(loss.streams if len(loss.streams) > 1 else [])]
    trained = {f"loss{suffix}" for suffix in spread} | {"lr"}
    evaluated = {f"{name}{suffix}" for name in losses for suffix in spread} | {"samples"}
    keys: set[str] = set()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fresh = {s.name: copy.deepcopy(s) for s in pipeline.statistics}
            for statistic in fresh.values():
                statistic.reset()
            keys |= set(statistic_values(fresh))
    except Exception:  # a third-party statistic that cannot compute while empty
        return set()
    return {
        f"{section}.{key}"
        for section in sections
        for key in keys | (trained if section == "training" else evaluated)
    }
