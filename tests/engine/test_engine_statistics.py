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


class SequencePipeline:
    """A pipeline that only scores given log-probabilities with a real sequence NLLLoss."""

    training = False

    def __init__(self) -> None:
        from torchloom.zoo.losses import NLLLoss

        self.losses = [NLLLoss.create(sequence=True, ignore_index=0)]

    def eval(self) -> None:
        pass

    def train(self, mode: bool = True) -> None:
        pass

    def update_statistics(self, batch: Batch, statistics: Any) -> None:
        pass

    def __call__(self, batch: Batch) -> None:
        scored = {"predictions": batch["predictions"], "targets": batch["targets"]}
        batch["loss"] = self.losses[0](scored)["loss"]


def test_a_sequence_loss_over_a_set_does_not_depend_on_how_it_is_batched() -> None:
    """Each batch's mean over its counted steps was weighted by its sentences: the same four
    sentences gave 2.69 or 3.73 as they were batched, where the loss per counted step is one
    number (what exp(loss), the perplexity, means)."""
    import torch.nn.functional as F

    from torchloom.engine.evaluation import evaluate
    from torchloom.engine.step import Precision, WeightedLoss

    torch.manual_seed(0)
    predictions = torch.log_softmax(torch.randn(4, 10, 5) * 3, dim=-1)
    targets = torch.randint(1, 5, (4, 10))
    targets[2:, 1:] = 0  # two sentences of one word, padded
    per_step = F.nll_loss(predictions.transpose(1, 2), targets, ignore_index=0, reduction="sum")
    expected = float(per_step) / int((targets != 0).sum())
    pipeline = SequencePipeline()
    loss = WeightedLoss(pipeline, {}, lambda *keys: "")  # type: ignore[arg-type]
    cpu = torch.device("cpu")
    for order, size in (([0, 1, 2, 3], 2), ([0, 2, 1, 3], 2), ([0, 1, 2, 3], 4), ([3, 2, 1, 0], 1)):
        batches = [
            {
                "predictions": predictions[order[i : i + size]],
                "targets": targets[order[i : i + size]],
            }
            for i in range(0, 4, size)
        ]
        values = evaluate(pipeline, batches, {}, loss, Precision("fp32", cpu), cpu)  # type: ignore[arg-type]
        assert values["loss"] == pytest.approx(expected, rel=1e-6), (order, size)
        assert values["samples"] == 4


def test_an_epoch_s_loss_is_the_mean_over_its_samples() -> None:
    """Batches of 8, 8, 8, 8 and a last one of 1, with losses 1, 1, 1, 1 and 5: the epoch's
    loss was the mean of the batches' (1.8), a last sample counting as much as 8."""
    from torchloom.statistics.accumulators import RunningStats

    stats = RunningStats()
    for value, samples in ((1.0, 8), (1.0, 8), (1.0, 8), (1.0, 8), (5.0, 1)):
        stats.add(torch.tensor(value), samples)
    values = stats.values("loss")
    assert values["loss"] == pytest.approx(37 / 33)
    assert (values["loss_min"], values["loss_max"]) == (1.0, 5.0)  # over batches, as before
    resumed = RunningStats()
    resumed.load_state_dict(stats.state_dict(), torch.device("cpu"))
    assert resumed.values("loss") == values
    # A checkpoint from before weights: its values count one each, later ones their weight.
    old = {"count": 2, "totals": torch.tensor([4.0, 10.0, 1.0, 3.0], dtype=torch.float64)}
    resumed.load_state_dict(old, torch.device("cpu"))
    resumed.add(torch.tensor(2.0), 2)
    assert resumed.values("loss")["loss"] == pytest.approx((4.0 + 2.0 * 2) / 4)
