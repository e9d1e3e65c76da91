"""Statistics that are right over a whole set: aggregated from counts, never batch means."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from torchloom.core.component import BuildContext, ComponentParams
from torchloom.core.streams import FLOATING, StreamSpec
from torchloom.zoo.pending_counts import CountsChoices, PendingColumns


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


class AccuracyStatistics(CountsChoices):
    """Classification accuracy over a whole set: correct predictions / counted targets.

    The prediction is the highest-scoring class (log-probabilities, probabilities or
    logits all work). Two integers are counted batch by batch on the model's device — right
    predictions and counted targets — and summed over processes under DDP, so the result is
    exact however the set is batched or split; an empty set gives NaN.

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
    right: torch.Tensor  # right predictions so far (a buffer)
    counted: torch.Tensor  # counted targets so far (a buffer)

    def __init__(self, params: AccuracyStatisticsParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.num_classes = int(self.global_value("num_classes"))
        ignored = params.ignore_index
        # An ignored value no prediction can take (-100, or none) never counts as right, so
        # the right predictions need no mask; only one inside the classes (<PAD> = 0) does.
        self._mask_right = ignored is not None and 0 <= ignored < self.num_classes
        # Buffers, so the counts follow the pipeline to its device; not persistent, so the
        # pipeline's own statistic adds nothing to checkpoints (count_persistently).
        self.register_buffer("right", torch.zeros((), dtype=torch.int64), persistent=False)
        self.register_buffer("counted", torch.zeros((), dtype=torch.int64), persistent=False)
        # The steps not yet counted: their flat argmax and targets (zoo/pending_counts.py).
        self._pending = PendingColumns(2)

    def count_persistently(self) -> None:
        for name in ("right", "counted"):
            self.register_buffer(name, getattr(self, name), persistent=True)

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

    def count_choices(self, chosen: torch.Tensor, targets: torch.Tensor) -> None:
        right = chosen == targets
        ignored = self.params.ignore_index
        if ignored is None:
            self.counted.add_(len(targets))
        else:
            counted = targets != ignored
            self.counted.add_(counted.sum().to(self.counted.device))
            if self._mask_right:
                right &= counted
        self.right.add_(right.sum().to(self.right.device))

    def compute(self) -> dict[str, float]:
        self.count_pending()
        counted = int(self.counted)
        if counted == 0:
            return {"accuracy": float("nan")}
        return {"accuracy": int(self.right) / counted}

    def reset(self) -> None:
        self._pending.clear()
        self.right.zero_()
        self.counted.zero_()

    def upgrade_saved_counts(self, state_dict: dict[str, Any], prefix: str) -> None:
        # Running counts saved before torchloom counted them itself are torchmetrics' micro
        # stat scores: right = tp, counted = tp + fn (a mid-epoch checkpoint of an older run).
        old = {key: f"{prefix}metric.{key}" for key in ("tp", "fp", "tn", "fn")}
        if old["tp"] in state_dict and f"{prefix}right" not in state_dict:
            scores = {key: state_dict.pop(name) for key, name in old.items() if name in state_dict}
            state_dict[f"{prefix}right"] = scores["tp"].sum().to(torch.int64)
            state_dict[f"{prefix}counted"] = (scores["tp"] + scores["fn"]).sum().to(torch.int64)
