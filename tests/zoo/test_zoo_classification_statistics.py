"""Precision / recall / F1 over a whole set, from confusion counts, checked by hand."""

from __future__ import annotations

import math

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
    assert math.isnan(statistic.compute()["f1_micro"])  # nothing counted, as accuracy says


@pytest.mark.parametrize("ignore_index", [-100, 0, None])
def test_ignored_and_out_of_range_targets_are_not_counted(ignore_index: int | None) -> None:
    statistic = PrecisionRecallStatistics.create(
        globals={"num_classes": 3}, confusion_counts=True, ignore_index=ignore_index
    )
    targets = torch.tensor([0, 1, 2, -100, 7, 0])
    predicted = torch.tensor([0, 1, 1, 2, 2, 1])
    statistic.update(
        {"predictions": torch.nn.functional.one_hot(predicted, 3).float(), "targets": targets}
    )
    counts = statistic.counts()
    expected = torch.zeros(3, 3, dtype=torch.int64)
    for target, chosen in zip(targets.tolist(), predicted.tolist(), strict=True):
        if 0 <= target < 3 and target != ignore_index:
            expected[target, chosen] += 1
    assert torch.equal(counts, expected)
    assert statistic.compute()["confusion_2_1"] == 1.0


@pytest.mark.filterwarnings("ignore:for confusion. copying from a non-meta")  # meta holds nothing
def test_counts_stay_on_the_statistic_s_device_and_never_read_it_back() -> None:
    """On a GPU the statistic counts on the device without the host waiting for it (the meta
    device, which holds no values, stands in: a boolean mask or a bincount fails there), and
    counts loaded from a checkpoint (read onto the host) go into its own buffer on the device,
    so a resumed run adds to them there and merges another process's."""
    statistic = PrecisionRecallStatistics.create(globals={"num_classes": 4})
    statistic.count_persistently()
    host = {"predictions": torch.randn(6, 4), "targets": torch.tensor([0, 1, 2, 3, 1, -100])}
    statistic.update(host)
    saved = statistic.state_dict()
    assert saved["confusion"].shape == (17,) and int(saved["confusion"][:-1].sum()) == 5
    on_meta = PrecisionRecallStatistics.create(globals={"num_classes": 4}).to("meta")
    on_meta.count_persistently()
    on_meta.update({name: value.to("meta") for name, value in host.items()})
    on_meta.count_pending()
    on_meta.load_state_dict(saved)
    assert on_meta.confusion.device.type == "meta"
    other = PrecisionRecallStatistics.create(globals={"num_classes": 4})
    other.count_persistently()
    other.load_state_dict(saved)  # another process's counts, read on the host
    on_meta.merge(other)
    assert on_meta.confusion.device.type == "meta"


def test_counts_an_older_version_saved_are_read() -> None:
    """A mid-epoch checkpoint of a run before this version holds torchmetrics' matrix."""
    statistic = PrecisionRecallStatistics.create(globals={"num_classes": 3}, confusion_counts=True)
    statistic.count_persistently()
    statistic.load_state_dict({"matrix.confmat": COUNTS.clone()})
    assert torch.equal(statistic.counts(), COUNTS)


def test_a_set_that_counted_nothing_has_nan_scores_not_zero() -> None:
    """Every target ignored: precision, recall and F1 were 0.0 (a model always wrong), where
    accuracy says NaN; early stopping on f1_macro read it as a real zero."""
    for average in ("micro", "macro", "weighted"):
        assert all(math.isnan(v) for v in averaged_scores(torch.zeros(3, 3), average)), average
