"""Precision, recall, F1 and confusion counts over a whole set, from one confusion matrix.

One `MulticlassConfusionMatrix` (torchmetrics: on the device, summed across processes under
DDP) holds the set's counts; every average is computed from those counts at the end, so the
figures are exact however the set was batched — never means of per-batch values.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field

from torchloom.core.component import Batch, BuildContext, ComponentParams, Statistic
from torchloom.core.streams import FLOATING, StreamSpec

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
    nor are predicted; weighted weighs by support; micro (single-label) equals accuracy."""
    counts = counts.double()
    if average == "micro":
        total = counts.sum()
        value = float(counts.diagonal().sum() / total) if total > 0 else 0.0
        return value, value, value
    scores = per_class_scores(counts)
    actual, predicted = counts.sum(1), counts.sum(0)
    if average == "weighted":
        weights = actual / actual.sum().clamp(min=1)
        precision, recall, f1 = (float((v * weights).sum()) for v in scores)
        return precision, recall, f1
    present = (actual + predicted) > 0
    if not present.any():
        return 0.0, 0.0, 0.0
    precision, recall, f1 = (float(v[present].mean()) for v in scores)
    return precision, recall, f1


class PrecisionRecallStatistics(Statistic):
    """Precision, recall and F1 (macro, micro, weighted averages; optionally per class and
    every confusion count) over the whole set.

    ```yaml
    pipeline:
      precision_recall: {type: PrecisionRecallStatistics, averages: [macro, weighted]}
    ```
    Reports e.g. `precision_macro`, `recall_weighted`, `f1_micro`; with `per_class`,
    `f1_<class>`; monitor them like any statistic (`validation.f1_macro`).
    """

    Params = PrecisionRecallParams
    params: PrecisionRecallParams
    NEEDS_GLOBALS = {"num_classes": "number of classes the predictions score"}
    EXAMPLE_GLOBALS = {"num_classes": 10}

    def __init__(self, params: PrecisionRecallParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.num_classes = int(self.global_value("num_classes"))
        self.matrix: Any = None  # made by ready(): importing torchmetrics takes seconds

    def ready(self) -> None:
        self._counts()

    def _counts(self, device: torch.device | None = None) -> Any:
        """The torchmetrics confusion matrix, made on first use (on `device`, when given)."""
        if self.matrix is not None:
            return self.matrix
        from torchmetrics.classification import MulticlassConfusionMatrix

        # validate_args=False: per-batch checks cost a host sync; dtypes are checked by the
        # handshake and the loss rejects out-of-range targets.
        self.matrix = MulticlassConfusionMatrix(
            self.num_classes, ignore_index=self.params.ignore_index, validate_args=False
        )
        if device is not None:
            self.matrix.to(device)
        return self.matrix

    def input_specs(self) -> dict[str, StreamSpec]:
        return {
            "predictions": StreamSpec(("batch", "classes"), FLOATING, "class scores per sample"),
            "targets": StreamSpec(("batch",), torch.int64, "class index per sample"),
        }

    def update(self, inputs: Batch) -> None:
        predictions = inputs["predictions"].detach()
        # Made here only outside a worker (a worker makes its copies ready first).
        self._counts(predictions.device).update(predictions, inputs["targets"].detach())

    def compute(self) -> dict[str, float]:
        if self.matrix is None:
            counts = torch.zeros(self.num_classes, self.num_classes, dtype=torch.long)
        else:
            counts = self.matrix.confmat.detach().cpu()
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

    def merge(self, other: Statistic) -> None:
        assert isinstance(other, PrecisionRecallStatistics)
        if other.matrix is not None:
            self._counts(other.matrix.confmat.device).merge_state(other.matrix)

    def reset(self) -> None:
        if self.matrix is not None:
            self.matrix.reset()
