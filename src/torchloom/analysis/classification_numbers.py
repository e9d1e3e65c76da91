"""The numbers behind the classification reports: confusion counts and binned score
histograms kept on the device, precision/recall/F1 from counts, ROC curves and AUC from the
histograms, and the markdown report. No files, no plots: `classification.py` does those.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from torchloom.analysis.image_grid import markdown_cell

# Scores are binned on the logit of the softmax probability, log(p / (1 - p)): a monotone
# map of p, so the ROC curve is the same, but trained models put most samples at p ~ 0 or
# p ~ 1, where equal-width probability bins would lump them together. Probabilities are
# clipped to [1e-7, 1 - 1e-7] (float32 cannot tell 1 - p apart much below that), so logits
# lie within +-16.1; 400 bins over [-16, 16] give 0.08 logit a bin.
ROC_BINS = 400
LOGIT_RANGE = 16.0
PROBABILITY_EPS = 1e-7


def bin_edges(device: torch.device | None = None) -> torch.Tensor:
    """The ROC_BINS - 1 inner edges of the score bins, on the logit scale."""
    return torch.linspace(-LOGIT_RANGE, LOGIT_RANGE, ROC_BINS + 1, device=device)[1:-1]


def score_bins(scores: torch.Tensor, edges: torch.Tensor | None = None) -> torch.Tensor:
    """Per sample and class, the bin of the softmax probability ([batch, classes] -> long,
    in [0, ROC_BINS)). Three kernels: this runs on every training step. Logits and
    log-probabilities give the same bins (softmax(log_softmax(x)) = softmax(x)); NaN and
    infinite scores still land in a valid bin (bucketize never leaves the range)."""
    probabilities = torch.softmax(scores.float(), dim=1)
    logits = torch.special.logit(probabilities, eps=PROBABILITY_EPS)
    return torch.bucketize(logits, bin_edges(scores.device) if edges is None else edges)


class ClassCounts:
    """Confusion and binned-score counts of one output over one pass, kept on the device.
    Targets outside [0, classes) (ignore indices) go to a last, discarded bin: filtering them
    out would need a host sync."""

    def __init__(self, classes: int, device: torch.device, with_scores: bool) -> None:
        self.classes = classes
        self.confusion = torch.zeros(classes * classes + 1, dtype=torch.long, device=device)
        size = 2 * classes * ROC_BINS + 1 if with_scores else 0
        self.scores = torch.zeros(size, dtype=torch.long, device=device)
        # Made once: every tensor op in `add` is a kernel launch on every training step.
        self.class_offsets = torch.arange(classes, device=device) * ROC_BINS
        self.edges = bin_edges(device)
        self.one = torch.ones(1, dtype=torch.long, device=device)

    def add(self, scores: torch.Tensor, targets: torch.Tensor) -> None:
        c = self.classes
        scores, targets = scores.detach(), targets.detach().reshape(-1).long()
        valid = (targets >= 0) & (targets < c)
        cell = torch.where(valid, targets * c + scores.argmax(dim=1), c * c)
        # scatter_add_ on a 1-D tensor: deterministic on CUDA, and unlike bincount no sync.
        self.confusion.scatter_add_(0, cell, self.one.expand(len(cell)))
        if self.scores.numel():
            positive = targets[:, None] * ROC_BINS == self.class_offsets
            index = positive * (c * ROC_BINS) + self.class_offsets + score_bins(scores, self.edges)
            index = torch.where(valid[:, None], index, 2 * c * ROC_BINS).reshape(-1)
            self.scores.scatter_add_(0, index, self.one.expand(len(index)))

    def host(self) -> tuple[np.ndarray, np.ndarray | None]:
        """(confusion [true, predicted], scores [negative/positive, class, bin] or None)."""
        c = self.classes
        confusion = self.confusion[:-1].cpu().numpy().reshape(c, c)
        if not self.scores.numel():
            return confusion, None
        return confusion, self.scores[:-1].cpu().numpy().reshape(2, c, ROC_BINS)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"confusion": self.confusion.cpu(), "scores": self.scores.cpu()}

    def load(self, state: Mapping[str, torch.Tensor]) -> None:
        if state["confusion"].shape == self.confusion.shape:
            self.confusion.copy_(state["confusion"])
        if state["scores"].shape == self.scores.shape:
            self.scores.copy_(state["scores"])


def ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """Element-wise division that gives 0 where the denominator is 0 (sklearn's default)."""
    out = np.zeros(numerator.shape, dtype=float)
    np.divide(numerator, denominator, out=out, where=denominator != 0)
    return out


def classification_report(
    counts: np.ndarray, class_names: Sequence[str], top: int = 3
) -> dict[str, Any]:
    """Accuracy, per-class precision/recall/F1/support, macro and weighted averages, and each
    class's most frequent wrong predictions, from a confusion matrix [true, predicted].
    Macro averages go over the classes that occur as truth or prediction (as sklearn's)."""
    counts = np.asarray(counts, dtype=np.int64)
    support, predicted, correct = counts.sum(1), counts.sum(0), np.diag(counts)
    precision, recall = ratio(correct, predicted), ratio(correct, support)
    f1 = ratio(2 * precision * recall, precision + recall)
    total = int(counts.sum())
    present = (support > 0) | (predicted > 0)
    keys = ("name", "precision", "recall", "f1", "support")
    columns = (class_names, precision.tolist(), recall.tolist(), f1.tolist(), support.tolist())
    classes = [dict(zip(keys, values, strict=True)) for values in zip(*columns, strict=True)]

    def average(weights: np.ndarray) -> dict[str, float]:
        scale = max(float(weights.sum()), 1e-300)
        return {
            key: float((values * weights).sum() / scale)
            for key, values in (("precision", precision), ("recall", recall), ("f1", f1))
        } | {"support": total}

    confusions: dict[str, list[dict[str, Any]]] = {}
    for truth, row in enumerate(counts):
        wrong = [(int(n), k) for k, n in enumerate(row) if k != truth and n > 0]
        wrong.sort(key=lambda item: (-item[0], item[1]))
        if wrong:
            confusions[class_names[truth]] = [
                {"predicted": class_names[k], "count": n, "share": n / int(support[truth])}
                for n, k in wrong[:top]
            ]
    return {
        "samples": total,
        "accuracy": float(correct.sum() / total) if total else 0.0,
        "classes": classes,
        "macro": average(present.astype(float)),
        "weighted": average(support.astype(float)),
        "confusions": confusions,
    }


@dataclass
class RocCurve:
    name: str
    fpr: np.ndarray
    tpr: np.ndarray
    auc: float


def binned_roc(name: str, positive: np.ndarray, negative: np.ndarray) -> RocCurve | None:
    """The ROC curve through the bin edges (thresholds from the highest score down); None
    without positives or negatives. Samples within a bin count as ties: the trapezoid."""
    if positive.sum() == 0 or negative.sum() == 0:
        return None
    tp = np.concatenate([[0], np.cumsum(positive[::-1])])
    fp = np.concatenate([[0], np.cumsum(negative[::-1])])
    tpr, fpr = tp / tp[-1], fp / fp[-1]
    auc = float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))
    return RocCurve(name, fpr, tpr, auc)


def roc_curves(scores: np.ndarray, class_names: Sequence[str]) -> list[RocCurve]:
    """Binary: one curve, the second class as positive. More classes: one-vs-rest per class,
    then the micro average (every sample-class pair pooled) last."""
    negative, positive = scores[0], scores[1]
    if len(class_names) == 2:
        curve = binned_roc(f"{class_names[1]} vs {class_names[0]}", positive[1], negative[1])
        return [curve] if curve else []
    curves = [binned_roc(n, positive[k], negative[k]) for k, n in enumerate(class_names)]
    curves.append(binned_roc("micro average", positive.sum(0), negative.sum(0)))
    return [c for c in curves if c is not None]


# ---- files -------------------------------------------------------------------------------
def report_markdown(title: str, report: Mapping[str, Any], curves: Sequence[RocCurve]) -> str:
    lines = [
        f"# {title}",
        "",
        f"{report['samples']} samples, accuracy {report['accuracy']:.4f}",
        "",
        "| class | precision | recall | F1 | support |",
        "|---|---:|---:|---:|---:|",
    ]
    rows = [(markdown_cell(c["name"]), c) for c in report["classes"]]
    rows += [("**macro avg**", report["macro"]), ("**weighted avg**", report["weighted"])]
    for name, v in rows:
        lines.append(
            f"| {name} | {v['precision']:.4f} | {v['recall']:.4f} | {v['f1']:.4f} "
            f"| {v['support']} |"
        )
    if curves:
        lines += [
            "",
            "ROC AUC: " + ", ".join(f"{markdown_cell(c.name)} {c.auc:.4f}" for c in curves),
        ]
    if report["confusions"]:
        lines += ["", "## Top confusions", "", "| true class | most often predicted as |"]
        lines.append("|---|---|")
        for truth, wrong in report["confusions"].items():
            shown = ", ".join(
                f"{markdown_cell(w['predicted'])} ({w['count']}, {w['share']:.1%})" for w in wrong
            )
            lines.append(f"| {markdown_cell(truth)} | {shown} |")
    return "\n".join(lines) + "\n"
