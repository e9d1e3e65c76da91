"""Statistics that are right over a whole set: aggregated from counts, never batch means."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from pydantic import Field

from torchloom.core.component import Batch, BuildContext, ComponentParams, Statistic
from torchloom.core.streams import FLOATING, StreamSpec


class AccuracyStatisticsParams(ComponentParams):
    ignore_index: int | None = Field(
        -100,
        description="Target value left out of the count (the losses' default too); "
        "null counts every target. Set it to the <PAD> index, 0, for padded word targets.",
    )
    sequence: bool = Field(
        False,
        description="Predictions are per step, [batch, -1, classes], with targets "
        "[batch, -1]: the accuracy counts every step whose target is not ignored.",
    )


class AccuracyStatistics(Statistic):
    """Classification accuracy over a whole set: correct predictions / counted targets.

    The prediction is the highest-scoring class (log-probabilities, probabilities or
    logits all work). Counts are accumulated batch by batch in a torchmetrics
    `MulticlassAccuracy` (micro average) that lives on the model's device and is summed over
    processes under DDP, so the result is exact however the set is batched or split; an empty
    set gives NaN.

    Streams: `predictions` [batch, classes] and `targets` [batch] (int64). With
    `sequence: true` they are [batch, -1, classes] and [batch, -1] (a decoder's words, a
    tagger's tags): the result is then the token accuracy over every counted step of the set,
    with the steps whose target is `ignore_index` (the padding) left out. Global:
    `num_classes` (the size of the classes dimension, a vocabulary size for words).

    ```yaml
    pipeline:
      accuracy:
        type: AccuracyStatistics
        streams: {predictions: predictions, targets: targets}
      word_accuracy:
        type: AccuracyStatistics
        sequence: true
        ignore_index: 0           # <PAD>
        globals: {num_classes: target_vocabulary_size}
    ```
    """

    Params = AccuracyStatisticsParams
    params: AccuracyStatisticsParams
    EXAMPLE_GLOBALS = {"num_classes": 10}
    NEEDS_GLOBALS = {"num_classes": "number of classes the predictions score"}

    def __init__(self, params: AccuracyStatisticsParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.num_classes = int(self.global_value("num_classes"))
        self.metric: Any = None  # made by ready(): importing torchmetrics takes seconds

    def ready(self) -> None:
        self._counts()

    def _counts(self, device: torch.device | None = None) -> Any:
        """The torchmetrics counter, made on first use (on `device`, when given)."""
        if self.metric is not None:
            return self.metric
        from torchmetrics.classification import MulticlassAccuracy

        # A submodule, so its counters follow the pipeline to its device; torchmetrics keeps
        # them out of the state_dict, so checkpoints do not change.
        # validate_args=False: torchmetrics' per-batch checks cost a host sync and half of the
        # update's time; the handshake has checked dtypes and the loss rejects bad targets.
        self.metric = MulticlassAccuracy(
            num_classes=self.num_classes,
            average="micro",
            ignore_index=self.params.ignore_index,
            validate_args=False,
        )
        if device is not None:
            self.metric.to(device)
        return self.metric

    def input_specs(self) -> dict[str, StreamSpec]:
        if self.params.sequence:
            return {
                "predictions": StreamSpec(
                    ("batch", -1, "classes"), FLOATING, "class scores per sample and step"
                ),
                "targets": StreamSpec(
                    ("batch", -1), torch.int64, "class index per sample and step"
                ),
            }
        return {
            "predictions": StreamSpec(("batch", "classes"), FLOATING, "class scores per sample"),
            "targets": StreamSpec(("batch",), torch.int64, "class index per sample"),
        }

    def update(self, inputs: Batch) -> None:
        predictions, targets = inputs["predictions"].detach(), inputs["targets"].detach()
        if predictions.dim() == 3:
            # Every step is one classification; torchmetrics' own multidim layout wants the
            # classes second, a flat batch of steps counts the same.
            predictions = predictions.reshape(-1, predictions.shape[-1])
            targets = targets.reshape(-1)
        # update(), not the metric's forward(): that would also compute a per-batch accuracy,
        # a wasted step (and a device sync) that nobody reads.
        # Made here only outside a worker (a worker makes its copies ready first).
        self._counts(predictions.device).update(predictions, targets)

    def compute(self) -> dict[str, float]:
        # Empty by its counts, not torchmetrics' update_count: a count restored from a
        # checkpoint, or merged in, has no updates of its own.
        if self.metric is None or int((self.metric.tp + self.metric.fn).sum()) == 0:
            return {"accuracy": float("nan")}  # torchmetrics would warn and say 0
        with warnings.catch_warnings():  # "compute before update": the counts say otherwise
            warnings.filterwarnings("ignore", message=".*was called before the ``update``")
            return {"accuracy": float(self.metric.compute())}

    def merge(self, other: Statistic) -> None:
        assert isinstance(other, AccuracyStatistics)
        if other.metric is not None:
            self._counts(other.metric.tp.device).merge_state(other.metric)

    def reset(self) -> None:
        if self.metric is not None:
            self.metric.reset()
