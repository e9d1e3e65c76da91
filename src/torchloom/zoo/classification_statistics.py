"""Precision, recall, F1 and confusion counts over a whole set, from one confusion matrix.

The statistic counts the set's confusion matrix itself, on the device (a buffer, added across
processes under DDP); every average is computed from those counts at the end, so the figures
are exact however the set was batched — never means of per-batch values. It copies each
step's argmax and targets aside and counts many steps at once (zoo/pending_counts.py), with
`scatter_add_` into the flat matrix, where torchmetrics' confusion matrix made the host wait
for a GPU twice a step (a boolean mask to drop ignored targets, and `bincount`).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from pydantic import Field

from torchloom.core.component import BuildContext, ComponentParams
from torchloom.core.streams import FLOATING, StreamSpec
from torchloom.zoo.pending_counts import CountsChoices, PendingColumns

Average = Literal["macro", "micro", "weighted"]
AVERAGES: tuple[Average, ...] = ("macro", "micro", "weighted")


class PrecisionRecallParams(ComponentParams):
    averages: list[Average] = Field(
        default_factory=lambda: list(AVERAGES),
        description="which averages over classes to report",
    )
    per_class: bool = Field(False, description="also report precision/recall/f1 of every class")
    confusion_counts: bool = Field(
        False, description="also report every confusion count as confusion_<target>_<predicted>"
    )
    ignore_index: int | None = Field(-100, description="target value left out of the counts")


def per_class_scores(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Precision, recall, F1 of every class from a confusion matrix [target, predicted].
    A class never predicted has precision 0; a class that never occurs has recall 0."""
    counts = counts.double()
    true_positives = counts.diagonal()
    predicted, actual = counts.sum(0), counts.sum(1)
    precision = torch.where(predicted > 0, true_positives / predicted.clamp(min=1), 0.0)
    recall = torch.where(actual > 0, true_positives / actual.clamp(min=1), 0.0)
    denominator = precision + recall
    f1 = torch.where(denominator > 0, 2 * precision * recall / denominator.clamp(min=1e-12), 0.0)
    return precision, recall, f1


def averaged_scores(counts: torch.Tensor, average: str) -> tuple[float, float, float]:
    """(precision, recall, f1) averaged over classes. Macro skips classes that neither occur
    nor are predicted; weighted weighs by support; micro (single-label) equals accuracy.
    NaN over a set that counted nothing (every target ignored), as accuracy: a 0 would read
    as a model that is always wrong."""
    counts = counts.double()
    if counts.sum() == 0:
        return math.nan, math.nan, math.nan
    if average == "micro":
        value = float(counts.diagonal().sum() / counts.sum())
        return value, value, value
    scores = per_class_scores(counts)
    actual, predicted = counts.sum(1), counts.sum(0)
    if average == "weighted":
        weights = actual / actual.sum().clamp(min=1)
        precision, recall, f1 = (float((v * weights).sum()) for v in scores)
        return precision, recall, f1
    present = (actual + predicted) > 0
    precision, recall, f1 = (float(v[present].mean()) for v in scores)
    return precision, recall, f1


class PrecisionRecallStatistics(CountsChoices):
    """Precision, recall and F1 (macro, micro, weighted averages; optionally per class and
    every confusion count) over the whole set.

    ```yaml
    pipeline:
      precision_recall: {type: PrecisionRecallStatistics, averages: [macro, weighted]}
    ```
    Reports e.g. `precision_macro`, `recall_weighted`, `f1_micro`; with `per_class`,
    `f1_<class>`; monitor them like any statistic (`validation.f1_macro`). Targets equal to
    `ignore_index`, or outside the classes, are not counted.
    """

    Params = PrecisionRecallParams
    params: PrecisionRecallParams
    NEEDS_GLOBALS = {"num_classes": "number of classes the predictions score"}
    EXAMPLE_GLOBALS = {"num_classes": 10}
    confusion: torch.Tensor  # [target * classes + predicted], then one bin of uncounted ones

    def __init__(self, params: PrecisionRecallParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.num_classes = int(self.global_value("num_classes"))
        # A buffer, so the counts follow the pipeline to its device; not persistent, so the
        # pipeline's own statistic adds nothing to checkpoints (count_persistently). Empty
        # until ready(): the engine's copies count, the pipeline's own never does, and the
        # matrix grows with the square of the classes.
        self.register_buffer("confusion", torch.zeros(0, dtype=torch.int64), persistent=False)
        self._pending = PendingColumns(2)  # each step's argmax and targets

    def ready(self) -> None:
        if not self.confusion.numel():
            size = self.num_classes * self.num_classes + 1
            self.confusion = torch.zeros(size, dtype=torch.int64, device=self.confusion.device)

    def count_persistently(self) -> None:
        self.ready()
        self.register_buffer("confusion", self.confusion, persistent=True)

    def input_specs(self) -> dict[str, StreamSpec]:
        return {
            "predictions": StreamSpec(("batch", "classes"), FLOATING, "class scores per sample"),
            "targets": StreamSpec(("batch",), torch.int64, "class index per sample"),
        }

    def count_choices(self, chosen: torch.Tensor, targets: torch.Tensor) -> None:
        self.ready()  # a statistic counted outside the engine (tests, a program's own)
        classes, ignored = self.num_classes, self.params.ignore_index
        counted = (targets >= 0) & (targets < classes)
        if ignored is not None:
            counted &= targets != ignored
        cells = torch.where(counted, targets * classes + chosen, classes * classes)
        # scatter_add_ into a 1-D tensor: deterministic on a GPU, and no host sync.
        ones = torch.ones_like(cells).to(self.confusion.device)
        self.confusion.scatter_add_(0, cells.to(self.confusion.device), ones)

    def counts(self) -> torch.Tensor:
        """The confusion matrix so far, [target, predicted], on the host."""
        self.count_pending()
        classes = self.num_classes
        if not self.confusion.numel():  # never counted
            return torch.zeros(classes, classes, dtype=torch.int64)
        return self.confusion[:-1].cpu().view(classes, classes)

    def compute(self) -> dict[str, float]:
        counts = self.counts()
        values: dict[str, float] = {}
        for average in self.params.averages:
            precision, recall, f1 = averaged_scores(counts, average)
            values |= {
                f"precision_{average}": precision,
                f"recall_{average}": recall,
                f"f1_{average}": f1,
            }
        if self.params.per_class:
            for name, scores in zip(
                ("precision", "recall", "f1"), per_class_scores(counts), strict=True
            ):
                values |= {f"{name}_{index}": float(v) for index, v in enumerate(scores)}
        if self.params.confusion_counts:
            for target in range(self.num_classes):
                for predicted in range(self.num_classes):
                    values[f"confusion_{target}_{predicted}"] = float(counts[target, predicted])
        return values

    def reset(self) -> None:
        self._pending.clear()
        self.confusion.zero_()

    def upgrade_saved_counts(self, state_dict: dict[str, Any], prefix: str) -> None:
        # Counts saved before the statistic counted them itself: torchmetrics' confusion
        # matrix [target, predicted] (a mid-epoch checkpoint of an older run).
        old = f"{prefix}matrix.confmat"
        if old in state_dict and f"{prefix}confusion" not in state_dict:
            matrix = state_dict.pop(old).to(torch.int64).reshape(-1)
            state_dict[f"{prefix}confusion"] = torch.cat([matrix, matrix.new_zeros(1)])
