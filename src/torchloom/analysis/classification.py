"""Classification reports per output and split: confusion matrix, precision/recall/F1, ROC
curves, and the misclassified samples.

Memory does not grow with the data: a pass is summarised by counts kept on the device — the
confusion matrix, and per class a histogram of scores split by positives and negatives (from
which ROC curves follow) — and misclassified samples are streamed to a CSV file
(prediction_errors.py). Training batches are counted in `after_step` with device operations
only (no host sync); counts are read once per pass. With several processes the hook runs in
each, on its share of every batch; at a pass's end the counts are added and the error rows
merged (one exchange per pass), and rank 0 writes. (Each process then holds its error rows
until the pass ends, and every process receives all of them: the exchange is an all-gather.)
Files, in `reports/` of the run folder:

    <output>-<split>-cm.png / -cm.csv   row-normalised confusion matrix (image / numbers)
    <output>-<split>-report.md          accuracy, per-class table, averages, top confusions
    <output>-<split>-roc.png / -roc.csv ROC curves with AUC (binary, or one-vs-rest + micro)
    <output>-<split>-errors.csv         misclassified samples (validation and test)
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from torchloom.analysis.classification_numbers import (
    ClassCounts,
    RocCurve,
    classification_report,
    ratio,
    report_markdown,
    roc_curves,
)
from torchloom.analysis.image_grid import class_names
from torchloom.analysis.plotting import CURVE_MARGINS, PlotBudget, figure, save_png
from torchloom.analysis.prediction_errors import (
    ERROR_COLUMNS,
    ErrorShare,
    ErrorStream,
    error_line,
    merge_shares,
)
from torchloom.analysis.schema import AnalysisConfig, OutputSpec
from torchloom.analysis.skipped import say_skipped
from torchloom.analysis.step_buffer import StepBuffer
from torchloom.core.component import Batch
from torchloom.data.atomic_files import write_text_atomic
from torchloom.data.csv_cells import safe_cells
from torchloom.engine.distributed import SINGLE, Distributed
from torchloom.engine.state import Hook

if TYPE_CHECKING:
    from torchloom.engine.state import RunView


def _write_csv(path: Path, rows: Sequence[Sequence[Any]]) -> None:
    text = io.StringIO(newline="")
    csv.writer(text).writerows(safe_cells(row) for row in rows)  # class names: user text
    write_text_atomic(path, text.getvalue())


def row_normalised(counts: np.ndarray) -> np.ndarray:
    return ratio(counts.astype(float), counts.sum(1, keepdims=True).astype(float))


def draw_confusion(path: Path, title: str, counts: np.ndarray, names: Sequence[str]) -> None:
    classes, shares = len(names), row_normalised(counts)
    side = min(4.0 + 0.45 * classes, 20.0)
    # Fixed margins (drawing twice as fast as a fitted layout), sized to the class names.
    named = classes <= 40
    label = 0.08 * max(map(len, names)) if named else 0.0
    bottom = 0.6 + (label if classes > 10 else 0.2)  # names below are vertical if many
    fig = figure(side + 1.6 + label, side + bottom, (0.6 + label, bottom, 0.3, 0.6))
    ax = fig.add_subplot()
    image = ax.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
    fig.colorbar(image, ax=ax, label="share of the true class", fraction=0.05, pad=0.03)
    if named:
        ax.set_xticks(range(classes), labels=names, rotation=90 if classes > 10 else 0)
        ax.set_yticks(range(classes), labels=names)
    if classes <= 20:  # counts readable in their cells
        for (i, j), n in np.ndenumerate(counts):
            if n:
                colour = "white" if shares[i, j] > 0.5 else "black"
                ax.text(j, i, str(n), ha="center", va="center", color=colour, fontsize=8)
    ax.set(xlabel="predicted", ylabel="true", title=title)
    save_png(fig, path, {"classes": list(names), "row_normalised": shares.round(6).tolist()})


def draw_roc(path: Path, title: str, curves: Sequence[RocCurve]) -> None:
    fig = figure(6.0, 5.0, CURVE_MARGINS)
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=0.8)
    labelled = len(curves) <= 11
    for curve in curves:
        micro = curve.name == "micro average"  # drawn bold; per-class labels only if few
        label = f"{curve.name} (AUC {curve.auc:.3f})" if labelled or micro else None
        style = {"linewidth": 2.0, "color": "black"} if micro else {"linewidth": 1.0}
        ax.plot(curve.fpr, curve.tpr, label=label, **style)
    ax.set(xlabel="false positive rate", ylabel="true positive rate", title=title)
    ax.set(xlim=(0, 1), ylim=(0, 1.01))
    if curves:
        ax.legend(loc="lower right", fontsize=7)
    save_png(fig, path, {"auc": {curve.name: round(curve.auc, 6) for curve in curves}})


@dataclass
class FinishedPass:
    """What one pass left, on the host: enough to draw its plots later."""

    title: str
    stem: Path  # reports/<output>-<split>
    names: list[str]
    confusion: np.ndarray
    curves: list[RocCurve]


@dataclass
class PassShare:
    """One output's pass as this process counted it, on the host: the confusion counts and
    the binned scores (None without ROC curves; both None where this process had no batch of
    the pass), the error rows it held (several processes), and once every process's shares
    are merged, the pass's error rows as one process writes them."""

    confusion: np.ndarray | None
    scores: np.ndarray | None
    errors: ErrorShare | None
    merged_errors: list[tuple[Any, int, int, float]] | None = None


# Beyond this many classes (ImageNet's 1000) an output gets no reports: its confusion counts
# grow with the square of the classes (a language model's vocabulary of 15,000 words: 1.8 GB
# for each split), and so do its plots.
MAX_CLASSES = 1000


class ClassificationAnalysis(Hook):
    """Confusion matrix, classification report, ROC curves and prediction errors for every
    output of the `analysis:` section, on training, validation and test passes."""

    name = "classification_analysis"
    every_rank = True  # each process counts its share; merged at the end of each pass

    def __init__(self, config: AnalysisConfig, budget: PlotBudget | None = None) -> None:
        # Shared with the run's other plotting hooks (analysis/build.py): together within it.
        self.budget = budget if budget is not None else PlotBudget()
        self.outputs = list(config.outputs)
        self.confusion_matrix = config.enabled("confusion_matrix")
        self.report = config.enabled("classification_report")
        self.roc = config.enabled("roc")
        self.prediction_errors = config.enabled("prediction_errors")
        self.counts: dict[tuple[str, str], ClassCounts] = {}
        self.errors: dict[tuple[str, str], ErrorStream] = {}
        self.open_passes: set[str] = set()
        self.pending: dict[tuple[str, str], FinishedPass] = {}
        self.names: dict[str, list[str]] = {}
        self.restored: dict[str, Any] = {}
        self.skipped: set[str] = set()
        # Training steps are counted a block of steps at a time (see step_buffer).
        self.step_buffers: dict[str, StepBuffer] = {}
        self.distributed: Distributed = SINGLE  # the run's, from before_train

    # ---- events ----------------------------------------------------------------------------
    def before_train(self, run: RunView) -> None:
        self.budget.start()  # the plotting budget counts the run's time from its start
        self.distributed = run.distributed

    def after_step(self, run: RunView, batch: Batch, loss: torch.Tensor) -> None:
        for output in self.outputs:
            self._count(run, "training", output, batch)

    def after_training_epoch(self, run: RunView, values: dict[str, Any]) -> None:
        self._flush_steps()
        # Counts restored from a save at an epoch's last batch are that epoch's: no batch is
        # left to take them up (the next epoch's report counted its samples twice).
        for output in self.outputs:
            restored = self.restored.pop(output.name, None)
            if restored is not None and (output.name, "training") not in self.counts:
                classes = math.isqrt(len(restored["confusion"]) - 1)  # classes² cells and one
                counts = ClassCounts(classes, torch.device("cpu"), with_scores=False)
                if self.distributed.main:  # the counts of every process: added once
                    counts.load(restored)
                self.counts[(output.name, "training")] = counts
                self.names.setdefault(output.name, _class_names(run, output, classes))
        self._finish(run, "training", keep=True)

    def eval_batch(self, run: RunView, section: str, batch: Batch) -> None:
        if section not in self.open_passes:  # the first batch of a pass: start afresh
            self._finish(run, section, keep=False)
            self.open_passes.add(section)
        for output in self.outputs:
            counts = self._count(run, section, output, batch)
            if counts is not None and self.prediction_errors:
                key = (output.name, section)
                if key not in self.errors:
                    names = self.names[output.name]
                    if self.distributed.active:  # rows held for rank 0 to merge
                        self.errors[key] = ErrorStream(names)
                    else:
                        path = self._reports(run) / f"{output.name}-{section}-errors.csv"
                        self.errors[key] = ErrorStream(names, path)
                self.errors[key].add(
                    batch.get(output.ids), batch[output.predictions], batch[output.targets]
                )

    def after_eval(self, run: RunView, section: str, values: dict[str, Any], partial: bool) -> None:
        self.open_passes.discard(section)
        self._finish(run, section, keep=not partial)

    def after_train(self, run: RunView, summary: dict[str, Any]) -> None:
        self._draw(run, force=True)

    def release(self) -> None:
        for stream in self.errors.values():  # passes an exception cut short: no half report
            stream.finish(keep=False)
        self.errors.clear()

    def state_dict(self) -> dict[str, Any]:
        # Training counts of an epoch in progress, so a run resumed mid-epoch reports the
        # whole epoch: every process's, added (rank 0 alone restores them). Evaluation
        # passes never span a checkpoint.
        self._flush_steps()
        mine = {
            name: counts.state_dict()
            for (name, split), counts in self.counts.items()
            if split == "training"
        }
        if not self.distributed.active:
            return mine
        total: dict[str, dict[str, torch.Tensor]] = {}
        for state in self.distributed.gather(mine):
            for name, tensors in state.items():
                if name not in total:
                    total[name] = {key: value.clone() for key, value in tensors.items()}
                else:
                    for key, value in tensors.items():
                        total[name][key] += value
        return total

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.restored = dict(state)

    # ---- counting and reporting ------------------------------------------------------------
    def _count(
        self, run: RunView, split: str, output: OutputSpec, batch: Batch
    ) -> ClassCounts | None:
        scores, targets = batch.get(output.predictions), batch.get(output.targets)
        if not isinstance(scores, torch.Tensor) or not isinstance(targets, torch.Tensor):
            return None
        key = (output.name, split)
        counts = self.counts.get(key)
        if counts is None:
            if scores.ndim != 2:
                if output.name not in self.skipped:  # say it once, not every batch
                    self.skipped.add(output.name)
                    shape = list(scores.shape)
                    why = f"'{output.predictions}' is {shape}, not [batch, classes]"
                    say_skipped(run, [f"classification reports (output '{output.name}')"], why)
                return None
            classes = int(scores.shape[1])
            if classes > MAX_CLASSES:
                if output.name not in self.skipped:
                    self.skipped.add(output.name)
                    why = (
                        f"'{output.predictions}' scores {classes} classes, more than "
                        f"{MAX_CLASSES}: a confusion matrix of {classes}x{classes} counts (on "
                        "the run's device, for each split) and plots of as many cells"
                    )
                    say_skipped(run, [f"classification reports (output '{output.name}')"], why)
                return None
            self.names.setdefault(output.name, _class_names(run, output, classes))
            # ROC curves for validation and test only: binning scores on every training step
            # was most of the analysis' cost, and a training-set ROC says little.
            with_scores = self.roc and split != "training"
            counts = self.counts[key] = ClassCounts(classes, scores.device, with_scores)
            if split == "training" and output.name in self.restored:
                restored = self.restored.pop(output.name)
                if self.distributed.main:  # the counts of every process: added once
                    counts.load(restored)
            if split == "training":
                self.step_buffers[output.name] = StepBuffer(counts.add)
        if split == "training":
            self.step_buffers[output.name].add(scores, targets.reshape(-1))
        else:
            counts.add(scores, targets)
        return counts

    def _flush_steps(self) -> None:
        for buffer in self.step_buffers.values():
            buffer.flush()

    def _finish(self, run: RunView, split: str, keep: bool) -> None:
        """End a pass: write its reports (keep) or drop it (a partial validation pass). With
        several processes, every one takes part in merging a kept pass (whatever share it
        had), and rank 0 writes."""
        passes: dict[str, PassShare] = {}
        for output in self.outputs:
            key = (output.name, split)
            counts = self.counts.pop(key, None)
            if split == "training":  # its buffer belonged to these counts
                self.step_buffers.pop(output.name, None)
            errors = self.errors.pop(key, None)
            if errors is not None:
                errors.finish(keep)
            if keep:
                confusion, scores = counts.host() if counts is not None else (None, None)
                held = errors.held_share() if errors is not None else None
                passes[output.name] = PassShare(confusion, scores, held)
        if not keep:
            return
        if self.distributed.active:
            passes = _merged(self.distributed.gather(passes))
            if not self.distributed.main:
                return
        for output in self.outputs:
            done = passes[output.name]
            if done.confusion is None:
                continue
            confusion, scores = done.confusion, done.scores
            names = self.names.get(output.name) or _class_names(run, output, len(confusion))
            curves = roc_curves(scores, names) if scores is not None else []
            stem = self._reports(run) / f"{output.name}-{split}"
            where = f"epoch {run.progress.row_epoch}, episode {run.progress.episode}"
            if split == "test" and (run.run_dir / "checkpoints" / "best.pt").exists():
                where = "best.pt"  # what the test pass evaluates (engine/final_test.py)
            title = f"{output.name}, {split} ({where})"
            if done.merged_errors is not None:  # one process streamed its own
                lines = [ERROR_COLUMNS, *(error_line(*row, names) for row in done.merged_errors)]
                _write_csv(stem.with_name(stem.name + "-errors.csv"), lines)
            if self.report:
                report = classification_report(confusion, names)
                path = stem.with_name(stem.name + "-report.md")
                write_text_atomic(path, report_markdown(title, report, curves))
            if self.confusion_matrix:
                shares = [[f"{v:.6g}" for v in row] for row in row_normalised(confusion)]
                rows = [["true \\ predicted", *names]]
                rows += [[n, *row] for n, row in zip(names, shares, strict=True)]
                _write_csv(stem.with_name(stem.name + "-cm.csv"), rows)
            if self.roc and curves:
                rows = [["curve", "auc"], *[[c.name, f"{c.auc:.6f}"] for c in curves]]
                _write_csv(stem.with_name(stem.name + "-roc.csv"), rows)
            self.pending[(output.name, split)] = FinishedPass(title, stem, names, confusion, curves)
        self._draw(run, force=False)

    def _draw(self, run: RunView, force: bool) -> None:
        budget = self.budget
        if not self.pending or not (force or budget.due("classification")):
            return  # drawn later: at the next pass within budget, or at the end of the run
        with budget.timed("classification"):
            for done in self.pending.values():
                accuracy = np.trace(done.confusion) / max(int(done.confusion.sum()), 1)
                if self.confusion_matrix:
                    path = done.stem.with_name(done.stem.name + "-cm.png")
                    title = f"{done.title}\naccuracy {accuracy:.4f}"
                    draw_confusion(path, title, done.confusion, done.names)
                if self.roc and done.curves:
                    path = done.stem.with_name(done.stem.name + "-roc.png")
                    draw_roc(path, f"ROC: {done.title}", done.curves)
        self.pending.clear()

    @staticmethod
    def _reports(run: RunView) -> Path:
        folder = run.run_dir / "reports"
        folder.mkdir(exist_ok=True)
        return folder


def _class_names(run: RunView, output: OutputSpec, classes: int) -> list[str]:
    """Names from the output's class-names global (image_grid.class_names), else numbers."""
    named = class_names(run.pipeline, output) or []
    return [named[k] if k < len(named) else str(k) for k in range(classes)]


def _merged(gathered: Sequence[dict[str, PassShare]]) -> dict[str, PassShare]:
    """Every process's shares of a pass (in rank order) made one: counts added, error rows
    merged in the order one process would have written them."""
    merged = {}
    for name in gathered[0]:
        shares = [by_output[name] for by_output in gathered]
        held = [share.errors for share in shares]
        rows = merge_shares(held) if any(h is not None for h in held) else None
        merged[name] = PassShare(
            _added([share.confusion for share in shares]),
            _added([share.scores for share in shares]),
            None,
            rows,
        )
    return merged


def _added(arrays: Sequence[np.ndarray | None]) -> np.ndarray | None:
    """The sum of the processes' counts that exist (a process may have had no batch)."""
    present = [array for array in arrays if array is not None]
    return np.sum(present, axis=0) if present else None
