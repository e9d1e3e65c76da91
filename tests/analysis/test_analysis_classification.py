"""Classification reports: the numbers against direct and hand computations, the hook's pass
logic on hand-made batches, and the files of a small real MNIST run."""

from __future__ import annotations

import csv
import json
import logging
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from matplotlib.image import imread

from torchloom.analysis.classification import ClassificationAnalysis
from torchloom.analysis.classification_numbers import (
    ROC_BINS,
    ClassCounts,
    classification_report,
    roc_curves,
    score_bins,
)
from torchloom.analysis.plotting import png_data
from torchloom.analysis.prediction_errors import ErrorStream
from torchloom.analysis.schema import AnalysisConfig
from torchloom.core.globals_store import GlobalsStore
from torchloom.engine.distributed import SINGLE, Distributed
from torchloom.engine.setup import prepare_training
from torchloom.engine.state import TrainOptions


def small_config(folder: Path, data: Path) -> Path:
    path = folder / "small.yml"
    path.write_text(
        f"""\
default_configs: [loom://mnist/lenet5.yml]
training:
  task: {{data_folder: {data}, subset: 256}}
  seed: 5
  logging_interval: 2
  terminal_conditions: {{epoch_limit: 2}}
validation:
  task: {{subset: 96}}
test:
  task: {{subset: 96}}
""",
        encoding="utf-8",
    )
    return path


def exact_auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """Mann-Whitney: the chance a positive outscores a negative, ties counting half."""
    pos, neg = scores[positive], scores[~positive]
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / (len(pos) * len(neg)))


def read_csv(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.reader(handle))


def assert_png_has_content(path: Path) -> None:
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert float(image[..., :3].std()) > 0.01, f"{path.name} is blank"


def table_rows(markdown: str) -> list[list[str]]:
    """The body rows of the first markdown table."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| class |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


# ---- the numbers -----------------------------------------------------------------------------
def test_confusion_counts_over_batches_equal_a_direct_count() -> None:
    generator = torch.Generator().manual_seed(0)
    counts = ClassCounts(5, torch.device("cpu"), with_scores=True)
    truth, guesses = [], []
    for size in (7, 32, 1, 19):
        scores = torch.randn(size, 5, generator=generator)
        targets = torch.randint(0, 5, (size,), generator=generator)
        targets[0] = -100  # an ignore index: counted nowhere
        counts.add(scores, targets)
        truth += targets.tolist()
        guesses += scores.argmax(1).tolist()
    direct = np.zeros((5, 5), dtype=np.int64)
    for t, p in zip(truth, guesses, strict=True):
        if t >= 0:
            direct[t, p] += 1
    confusion, scores_hist = counts.host()
    assert np.array_equal(confusion, direct)
    assert scores_hist is not None and scores_hist.shape == (2, 5, ROC_BINS)
    # Every valid sample is a positive of one class and a negative of the four others.
    assert scores_hist[1].sum() == direct.sum() and scores_hist[0].sum() == 4 * direct.sum()


def test_report_matches_a_hand_computation() -> None:
    # true \ predicted: cat, dog, bird
    counts = np.array([[5, 2, 0], [1, 3, 1], [0, 0, 0]])
    report = classification_report(counts, ["cat", "dog", "bird"])
    assert report["samples"] == 12 and report["accuracy"] == pytest.approx(8 / 12)
    cat, dog, bird = report["classes"]
    # cat: precision 5/6, recall 5/7; dog: precision 3/5, recall 3/5.
    assert cat["precision"] == pytest.approx(5 / 6) and cat["recall"] == pytest.approx(5 / 7)
    assert cat["f1"] == pytest.approx(2 * (5 / 6) * (5 / 7) / (5 / 6 + 5 / 7))
    assert dog["precision"] == pytest.approx(0.6) and dog["f1"] == pytest.approx(0.6)
    assert (cat["support"], dog["support"], bird["support"]) == (7, 5, 0)
    # bird is predicted once and never right: precision, recall and F1 are 0 (no division).
    assert bird["precision"] == bird["recall"] == bird["f1"] == 0.0
    macro_f1 = (cat["f1"] + dog["f1"] + 0.0) / 3  # bird occurs (as a prediction): it counts
    assert report["macro"]["f1"] == pytest.approx(macro_f1)
    assert report["weighted"]["recall"] == pytest.approx((7 * 5 / 7 + 5 * 3 / 5) / 12)
    assert report["confusions"]["cat"] == [{"predicted": "dog", "count": 2, "share": 2 / 7}]
    assert [w["predicted"] for w in report["confusions"]["dog"]] == ["cat", "bird"]
    assert "bird" not in report["confusions"]


def test_binned_auc_is_close_to_the_exact_auc() -> None:
    generator = torch.Generator().manual_seed(1)
    targets = torch.randint(0, 3, (600,), generator=generator)
    logits = torch.randn(600, 3, generator=generator) + 1.5 * torch.nn.functional.one_hot(targets)
    counts = ClassCounts(3, torch.device("cpu"), with_scores=True)
    for chunk in range(0, 600, 64):
        counts.add(logits[chunk : chunk + 64], targets[chunk : chunk + 64])
    _, hist = counts.host()
    assert hist is not None
    curves = {c.name: c for c in roc_curves(hist, ["a", "b", "c"])}
    probabilities = torch.softmax(logits, 1).numpy()
    for index, name in enumerate("abc"):
        exact = exact_auc(probabilities[:, index], targets.numpy() == index)
        assert curves[name].auc == pytest.approx(exact, abs=0.005)
    micro = exact_auc(probabilities.reshape(-1), np.eye(3, dtype=bool)[targets.numpy()].reshape(-1))
    assert curves["micro average"].auc == pytest.approx(micro, abs=0.005)


def test_binary_roc_is_one_curve_and_perfect_separation_gives_one() -> None:
    targets = torch.tensor([0, 0, 1, 1, 1])
    logits = torch.tensor([[3.0, -3], [2, -1], [-1, 2], [-2, 5], [0, 9]])
    counts = ClassCounts(2, torch.device("cpu"), with_scores=True)
    counts.add(logits, targets)
    _, hist = counts.host()
    assert hist is not None
    (curve,) = roc_curves(hist, ["no", "yes"])
    assert curve.name == "yes vs no" and curve.auc == pytest.approx(1.0)


def test_score_bins_are_the_same_for_logits_and_log_probabilities() -> None:
    logits = torch.randn(50, 4, generator=torch.Generator().manual_seed(2)) * 8
    assert torch.equal(score_bins(logits), score_bins(torch.log_softmax(logits, 1)))
    extreme = score_bins(torch.tensor([[100.0, -100.0], [float("nan"), 0.0]]))
    assert extreme.min() >= 0 and extreme.max() <= ROC_BINS - 1


# ---- the hook's passes, on hand-made batches -------------------------------------------------
def fake_run(folder: Path, distributed: Distributed = SINGLE) -> Any:
    """A run as the hook sees it (of `distributed`'s process); class names zero, one, two."""
    store = GlobalsStore()
    store.publish("label_word_mappings", {"zero": 0, "one": 1, "two": 2}, "test")
    task = SimpleNamespace(output_specs=lambda: {"targets": None}, stream_name=lambda key: key)
    return SimpleNamespace(
        run_dir=folder,
        progress=SimpleNamespace(epoch=1, episode=10, row_epoch=1),
        pipeline=SimpleNamespace(globals=store, tasks={"validation": task}),
        log=logging.getLogger("test"),
        distributed=distributed,
    )


def batch(ids: list[int], targets: list[int], predicted: list[int]) -> dict[str, Any]:
    scores = torch.full((len(ids), 3), -5.0)
    scores[torch.arange(len(ids)), torch.tensor(predicted)] = 5.0
    return {"indices": torch.tensor(ids), "targets": torch.tensor(targets), "predictions": scores}


def test_partial_validation_passes_are_dropped_and_full_ones_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ErrorStream, "FLUSH", 2)  # rows reach the file within a pass
    run, hook = fake_run(tmp_path), ClassificationAnalysis(AnalysisConfig())
    reports = tmp_path / "reports"
    hook.eval_batch(run, "validation", batch([0, 1], [0, 1], [2, 2]))
    hook.after_eval(run, "validation", {}, partial=True)
    assert not any(reports.glob("*")), "a partial pass leaves no file"
    hook.eval_batch(run, "validation", batch([0, 1, 2], [0, 1, 2], [0, 2, 2]))
    hook.eval_batch(run, "validation", batch([3], [1], [0]))
    hook.after_eval(run, "validation", {}, partial=False)
    rows = read_csv(reports / "predictions-validation-errors.csv")
    assert rows[0][:4] == ["id", "truth", "prediction", "confidence"]
    assert [r[:3] + r[4:] for r in rows[1:]] == [
        ["1", "1", "2", "one", "two"],
        ["3", "1", "0", "one", "zero"],
    ]
    assert all(float(r[3]) > 0.99 for r in rows[1:])
    shares = read_csv(reports / "predictions-validation-cm.csv")
    assert shares[0] == ["true \\ predicted", "zero", "one", "two"]
    assert [float(v) for v in shares[2][1:]] == [0.5, 0.0, 0.5]  # the partial pass is not in
    text = (reports / "predictions-validation-report.md").read_text()
    assert "4 samples, accuracy 0.5000" in text and len(table_rows(text)) == 3 + 2
    hook.after_train(run, {})
    for kind in ("cm", "roc"):
        assert_png_has_content(reports / f"predictions-validation-{kind}.png")


def test_training_counts_survive_a_checkpoint(tmp_path: Path) -> None:
    run, hook = fake_run(tmp_path), ClassificationAnalysis(AnalysisConfig())
    hook.after_step(run, batch([0, 1], [0, 1], [0, 0]), torch.tensor(0.0))
    state = hook.state_dict()
    resumed = ClassificationAnalysis(AnalysisConfig())
    resumed.load_state_dict(state)
    resumed.after_step(run, batch([2], [2], [2]), torch.tensor(0.0))
    resumed.after_training_epoch(run, {})
    text = (tmp_path / "reports" / "predictions-training-report.md").read_text()
    assert "3 samples, accuracy 0.6667" in text
    assert not (tmp_path / "reports" / "predictions-training-errors.csv").exists()


def test_counts_saved_at_an_epoch_s_last_batch_are_that_epoch_s(tmp_path: Path) -> None:
    """A stop at an epoch's last batch: the resumed session has none of that epoch left, so
    its counts waited for the next epoch's first batch and were added to them (80 samples
    reported for an epoch of 40)."""
    run, hook = fake_run(tmp_path), ClassificationAnalysis(AnalysisConfig())
    hook.after_step(run, batch([0, 1], [0, 1], [0, 0]), torch.tensor(0.0))
    resumed = ClassificationAnalysis(AnalysisConfig())
    resumed.load_state_dict(hook.state_dict())
    resumed.after_training_epoch(run, {})  # the epoch ends at once
    report = tmp_path / "reports" / "predictions-training-report.md"
    assert "2 samples, accuracy 0.5000" in report.read_text()
    resumed.after_step(run, batch([2], [2], [2]), torch.tensor(0.0))
    resumed.after_training_epoch(run, {})
    assert "1 samples, accuracy 1.0000" in report.read_text()


# ---- a real run ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mnist_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("classification")
    config = small_config(folder, tmp_path_factory.mktemp("mnist"))
    options = TrainOptions(
        expdir=str(folder / "runs"),
        quiet=True,
        tensorboard=0,
        hooks=[ClassificationAnalysis(AnalysisConfig())],
    )
    return prepare_training(config, [], options).run().run_dir


@pytest.mark.parametrize("split", ["training", "validation", "test"])
def test_a_run_leaves_every_report(mnist_run: Path, split: str) -> None:
    reports = mnist_run / "reports"
    assert_png_has_content(reports / f"predictions-{split}-cm.png")
    shown = png_data(reports / f"predictions-{split}-cm.png")
    assert shown["classes"] == [str(d) for d in range(10)]
    assert np.asarray(shown["row_normalised"]).shape == (10, 10)
    shares = read_csv(reports / f"predictions-{split}-cm.csv")
    assert shares[0][1:] == [str(d) for d in range(10)] and len(shares) == 11
    for row in shares[1:]:
        total = sum(float(v) for v in row[1:])  # written with 6 digits
        assert total == 0.0 or total == pytest.approx(1.0, abs=1e-4)
    text = (reports / f"predictions-{split}-report.md").read_text()
    rows = table_rows(text)
    assert [r[0] for r in rows] == [str(d) for d in range(10)] + [
        "**macro avg**",
        "**weighted avg**",
    ]
    expected = {"training": 256, "validation": 96, "test": 96}[split]
    assert int(rows[-1][4]) == expected  # support of the whole pass (the latest epoch)
    # The test pass evaluates best.pt: it was titled with the last epoch.
    title = text.splitlines()[0]
    assert ("(best.pt)" in title) == (split == "test"), title
    if split == "training":  # ROC curves are drawn for validation and test only (cost)
        assert not (reports / "predictions-training-roc.png").exists()
        return
    assert_png_has_content(reports / f"predictions-{split}-roc.png")
    auc = read_csv(reports / f"predictions-{split}-roc.csv")
    assert auc[-1][0] == "micro average" and 0.5 < float(auc[-1][1]) <= 1.0
    drawn = png_data(reports / f"predictions-{split}-roc.png")["auc"]
    assert list(drawn) == [row[0] for row in auc[1:]]


def test_prediction_errors_are_the_misclassified_test_samples(mnist_run: Path) -> None:
    summary = json.loads((mnist_run / "summary.json").read_text())
    rows = read_csv(mnist_run / "reports" / "predictions-test-errors.csv")[1:]
    assert all(r[1] != r[2] and 0.0 < float(r[3]) <= 1.0 for r in rows)
    assert len({r[0] for r in rows}) == len(rows) and all(0 <= int(r[0]) < 96 for r in rows)
    accuracy = summary["final"]["test"]["accuracy"]
    assert len(rows) == round((1 - accuracy) * 96)
    assert not (mnist_run / "reports" / "predictions-training-errors.csv").exists()


def test_run_log_says_what_the_analysis_cost(mnist_run: Path) -> None:
    line = next(
        line for line in (mnist_run / "run.log").read_text().splitlines() if "analysis took" in line
    )
    match = re.search(
        r"analysis took ([\d.]+) s of the ([\d.]+) s of training \(([\d.]+)%\), "
        r"and ([\d.]+) s after it",
        line,
    )
    assert match, line
    during, training, share, after = (float(v) for v in match.groups())
    assert training > 0 and during <= training
    assert 0 <= share <= 100
    assert after > 0  # the final confusion matrices and ROC curves are drawn after training


def test_prediction_errors_are_read_back_in_four_copies_a_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each read of a GPU tensor waits for the GPU's queue: a flush read four per waiting
    batch (truth, guess, confidence, ids), 512 waits a flush at batch 64; now one a column.
    The rows are those of a sample-by-sample reading."""
    generator = torch.Generator().manual_seed(0)
    batches = [
        (
            torch.arange(7 * b, 7 * b + 7) * 10,
            torch.randn(7, 3, generator=generator),
            torch.randint(0, 3, (7,), generator=generator),
        )
        for b in range(100)
    ]
    stream = ErrorStream(["a", "b", "c"], tmp_path / "errors.csv")
    for ids, scores, targets in batches:
        stream.add(ids, scores, targets)
    reads: list[torch.Tensor] = []
    original = torch.Tensor.cpu

    def counted(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        reads.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", counted)
    stream.finish(keep=True)
    monkeypatch.undo()
    assert len(reads) == 4
    with open(tmp_path / "errors.csv", newline="") as handle:
        rows = list(csv.reader(handle))[1:]
    expected = [
        [str(int(i)), str(int(t)), str(int(p)), f"{float(c):.6f}", "abc"[t], "abc"[p]]
        for ids, scores, targets in batches
        for i, t, p, c in zip(
            ids,
            targets,
            scores.argmax(1),
            torch.softmax(scores, 1).amax(1),
            strict=True,
        )
        if t != p
    ]
    assert rows == expected and len(rows) > 300


def test_the_task_s_class_names_name_only_an_output_of_the_task_s_targets(tmp_path: Path) -> None:
    """A multitask pipeline's parity head (targets made from the digits) was reported with the
    task's class names: 'T-shirt/top' and 'Trouser' for odd and even on Fashion-MNIST."""
    from torchloom.analysis.image_grid import class_names
    from torchloom.analysis.schema import OutputSpec

    pipeline = fake_run(tmp_path).pipeline
    assert class_names(pipeline, OutputSpec()) == ["zero", "one", "two"]
    assert class_names(pipeline, OutputSpec(targets="parity_targets")) is None
    # named in the config: the user's choice stands
    chosen = OutputSpec(targets="parity_targets", class_names="label_word_mappings")
    assert class_names(pipeline, chosen) == ["zero", "one", "two"]


def test_a_report_of_an_epoch_cut_short_is_titled_with_its_own_number(tmp_path: Path) -> None:
    """A run stopped by its episode limit two batches into epoch 2 titled its reports
    'epoch 1' (the epochs completed) where its CSV rows say 2."""
    from torchloom.engine.state import Progress

    run, hook = fake_run(tmp_path), ClassificationAnalysis(AnalysisConfig())
    run.progress = Progress(epoch=1, episode=7, batch_in_epoch=2)
    hook.eval_batch(run, "validation", batch([0, 1], [0, 1], [0, 1]))
    hook.after_eval(run, "validation", {}, partial=False)
    title = (tmp_path / "reports" / "predictions-validation-report.md").read_text().splitlines()[0]
    assert "(epoch 2, episode 7)" in title
