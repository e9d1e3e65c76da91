"""Precision / recall / F1 over a whole set, from confusion counts, checked by hand."""

from __future__ import annotations

import pytest
import torch

from torchloom.zoo.classification_statistics import (
    PrecisionRecallStatistics,
    averaged_scores,
    per_class_scores,
)

# targets x predictions for 3 classes: class 2 is never predicted.
COUNTS = torch.tensor([[3, 1, 0], [1, 2, 0], [1, 1, 0]])


def test_per_class_scores_by_hand() -> None:
    precision, recall, f1 = per_class_scores(COUNTS)
    assert precision.tolist() == pytest.approx([3 / 5, 2 / 4, 0.0])
    assert recall.tolist() == pytest.approx([3 / 4, 2 / 3, 0.0])
    assert f1[0] == pytest.approx(2 * 0.6 * 0.75 / 1.35)


def test_averages_by_hand() -> None:
    accuracy = 5 / 9
    assert averaged_scores(COUNTS, "micro") == pytest.approx((accuracy,) * 3)
    macro_precision = (3 / 5 + 2 / 4 + 0) / 3
    assert averaged_scores(COUNTS, "macro")[0] == pytest.approx(macro_precision)
    weighted_recall = (4 * 3 / 4 + 3 * 2 / 3 + 2 * 0) / 9
    assert averaged_scores(COUNTS, "weighted")[1] == pytest.approx(weighted_recall)


def test_statistic_over_uneven_batches_equals_the_whole_set() -> None:
    statistic = PrecisionRecallStatistics.create(
        globals={"num_classes": 3}, per_class=True, confusion_counts=True
    )
    targets = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2])
    predicted = torch.tensor([0, 0, 0, 1, 0, 1, 1, 0, 1])
    scores = torch.nn.functional.one_hot(predicted, 3).float()
    for start, stop in ((0, 2), (2, 7), (7, 9)):  # batches of 2, 5 and 2
        statistic.update({"predictions": scores[start:stop], "targets": targets[start:stop]})
    values = statistic.compute()
    assert values["f1_micro"] == pytest.approx(5 / 9)
    assert values["precision_0"] == pytest.approx(3 / 5)
    assert values["confusion_2_0"] == 1.0 and values["confusion_0_1"] == 1.0
    statistic.reset()
    assert statistic.compute()["f1_micro"] == 0.0
