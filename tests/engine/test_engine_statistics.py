"""The engine's copies of a pipeline's statistics keep their counts on the run's device when
counts are loaded into them (a resumed run's, another process's): a statistic that holds a
torchmetrics metric takes loaded tensors as they are, on the host, where a GPU run then adds
its own to them and fails. The meta device stands in for a GPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from torchloom.core.component import Batch, BuildContext, ComponentParams, Statistic
from torchloom.core.streams import StreamSpec
from torchloom.engine import evaluation
from torchloom.engine.distributed import Distributed
from torchloom.engine.evaluation import TrainingStatistics, combine


class TargetSum(Statistic):
    """Sums its targets in a torchmetrics metric, as a user's statistic might."""

    def __init__(self, params: ComponentParams, context: BuildContext) -> None:
        super().__init__(params, context)
        from torchmetrics import SumMetric

        self.metric = SumMetric()

    def input_specs(self) -> dict[str, StreamSpec]:
        return {"targets": StreamSpec(("batch",), torch.int64, "class index")}

    def update(self, inputs: Batch) -> None:
        self.metric.update(inputs["targets"].float())

    def merge(self, other: Statistic) -> None:
        assert isinstance(other, TargetSum)
        self.metric.merge_state(other.metric)

    def compute(self) -> dict[str, float]:
        return {"target_sum": float(self.metric.compute())}

    def reset(self) -> None:
        self.metric.reset()


class Pipeline:
    def __init__(self) -> None:
        self.statistics = [TargetSum.create(name="sum")]


def saved_counts() -> dict[str, Any]:
    statistic = TargetSum.create(name="sum")
    statistic.count_persistently()
    statistic.update({"targets": torch.tensor([1, 2, 3])})
    return dict(statistic.state_dict())


def on_meta(statistic: Statistic) -> bool:
    return all(t.device.type == "meta" for t in statistic.metric.metric_state.values())


def test_counts_a_resumed_run_loads_stay_on_the_device() -> None:
    training = TrainingStatistics(Pipeline(), torch.device("meta"))  # type: ignore[arg-type]
    assert on_meta(training.epoch["sum"])
    state = saved_counts()
    training.load_state_dict({"train_statistics": {"sum": state}, "interval_statistics": {}})
    assert on_meta(training.epoch["sum"])


def test_counts_another_process_sends_are_merged_on_the_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mine = TargetSum.create(name="sum").to("meta")
    mine.count_persistently()
    two = Distributed(rank=0, world=2)
    monkeypatch.setattr(evaluation, "_on_cpu", dict)  # meta's counts: nothing to copy
    monkeypatch.setattr(Distributed, "gather", lambda self, value: [value, {"sum": saved_counts()}])
    combine({"sum": mine}, two, torch.device("meta"))
    assert on_meta(mine)
