"""Worst samples: the loss of every sample, by its stable id, across epochs; the hardest ones.

For each analysed output, the per-sample cross entropy of its predictions against its targets
(the same for logits and log-probabilities, log_softmax being idempotent) is written by sample
id into a device tensor [epochs, samples], one row per epoch (training: the losses of the
training steps; validation: of each full validation pass). That, the target and the last
prediction of each sample are all that is kept: ids and losses, never outputs. A step costs a
few device kernels and no host sync; the host reads the history once per epoch, to write

    reports/worst_samples/heatmap.png   loss per epoch of the `count` hardest samples
    reports/worst_samples/worst.csv     id, cumulative loss, last loss, target, prediction
    reports/worst_samples/worst.png     their images (read from the task by id), captioned
    reports/worst_samples/worst.md      their texts, when the output names a texts stream

(with several outputs, each file name starts with `<output>-`). The history goes into
checkpoints, so a resumed run continues it.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from torchloom.analysis.image_grid import (
    class_label,
    class_names,
    fetch_samples,
    image_key,
    markdown_cell,
    save_grid,
    task_key,
)
from torchloom.analysis.plotting import PlotBudget, figure, save_png
from torchloom.analysis.schema import AnalysisConfig, OutputSpec, WorstSamplesConfig
from torchloom.analysis.skipped import say_skipped
from torchloom.analysis.step_buffer import StepBuffer
from torchloom.core.component import Batch
from torchloom.data.atomic_files import write_text_atomic
from torchloom.engine.state import Hook

if TYPE_CHECKING:
    from torchloom.engine.state import RunView


class LossHistory:
    """Per-sample losses of one output: `history` [epochs, samples] on the device, NaN where a
    sample was not seen; `labels` numbers the rows (the epoch each one belongs to)."""

    def __init__(self, output: OutputSpec, size: int, device: torch.device) -> None:
        self.output = output
        self.history = torch.empty(0, size, device=device)
        self.labels: list[int] = []
        self.targets = torch.full((size,), -1, dtype=torch.int64, device=device)
        self.predictions = torch.full((size,), -1, dtype=torch.int64, device=device)

    @property
    def size(self) -> int:
        return int(self.history.shape[1])

    def blank_row(self) -> torch.Tensor:
        return torch.full((self.size,), float("nan"), device=self.history.device)

    def add_row(self, row: torch.Tensor, label: int) -> None:
        # A copy per epoch (not per step) keeps the tensor exactly [epochs, samples].
        self.history = torch.cat([self.history, row.unsqueeze(0)])
        self.labels.append(label)

    def row_for_epoch(self, epoch: int) -> torch.Tensor:
        """The row of a training epoch (0-based), added (with any skipped ones) when new."""
        while len(self.labels) <= epoch:
            self.add_row(self.blank_row(), len(self.labels) + 1)
        return self.history[epoch]

    def problem(self, batch: Batch) -> str | None:
        """Why this batch cannot be tracked (checked on shapes only: no host sync)."""
        out = self.output
        missing = [s for s in (out.predictions, out.targets, out.ids) if s not in batch]
        if missing:
            return f"the batch has no stream {', '.join(missing)}"
        predictions, targets, ids = batch[out.predictions], batch[out.targets], batch[out.ids]
        if not all(isinstance(t, torch.Tensor) for t in (predictions, targets, ids)):
            return "its streams are not tensors"
        if predictions.ndim != 2 or targets.ndim != 1 or ids.ndim != 1:
            return (
                f"predictions must be [batch, classes] and targets and ids [batch], got "
                f"{list(predictions.shape)}, {list(targets.shape)}, {list(ids.shape)}"
            )
        return None

    def observe(self, batch: Batch, row: torch.Tensor) -> None:
        """Write the batch's per-sample losses into `row` by sample id (device only)."""
        out = self.output
        self.observe_block(batch[out.predictions], batch[out.targets], batch[out.ids], row)

    @torch.no_grad()
    def observe_block(
        self, scores: torch.Tensor, targets: torch.Tensor, ids: torch.Tensor, row: torch.Tensor
    ) -> None:
        """`observe` for the samples of one batch or of a block of steps."""
        device = self.history.device
        targets = targets.to(device, torch.int64, non_blocking=True)
        ids = ids.to(device, torch.int64, non_blocking=True)
        losses = F.cross_entropy(scores.detach().float(), targets, reduction="none")
        row.index_copy_(0, ids, losses.to(row.dtype))
        self.targets.index_copy_(0, ids, targets)
        self.predictions.index_copy_(0, ids, scores.argmax(dim=1))

    def state_dict(self) -> dict[str, Any]:
        return {
            "history": self.history.cpu(),
            "labels": list(self.labels),
            "targets": self.targets.cpu(),
            "predictions": self.predictions.cpu(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Adopt a checkpoint's history; False when it was kept for another data set size."""
        history = state["history"]
        if history.ndim != 2 or history.shape[1] != self.size:
            return False
        device = self.history.device
        self.history = history.to(device, torch.float32)
        self.labels = [int(v) for v in state["labels"]]
        self.targets = state["targets"].to(device)
        self.predictions = state["predictions"].to(device)
        return True

    def hardest(self, count: int) -> list[dict[str, Any]]:
        """The `count` seen samples of highest cumulative loss, hardest first. Reduced on the
        device; only their columns come to the host."""
        history = self.history
        seen = ~torch.isnan(history)
        ever_seen = seen.any(dim=0)
        cumulative = torch.nansum(history, dim=0).masked_fill(~ever_seen, float("-inf"))
        count = min(count, int(ever_seen.sum()))
        if count == 0:
            return []
        top, ids = torch.topk(cumulative, count)
        columns = history[:, ids].cpu()
        targets, predictions = self.targets[ids].cpu(), self.predictions[ids].cpu()
        rows = []
        for column, (i, total) in enumerate(zip(ids.tolist(), top.tolist(), strict=True)):
            losses = columns[:, column]
            latest = losses[~torch.isnan(losses)][-1]  # the last epoch it was seen in
            rows.append(
                {
                    "id": i,
                    "cumulative_loss": total,
                    "last_loss": float(latest),
                    "target": int(targets[column]),
                    "prediction": int(predictions[column]),
                }
            )
        return rows


class WorstSamples(Hook):
    """Tracks per-sample losses of the configured section and exports the hardest samples."""

    name = "worst_samples"

    def __init__(self, config: AnalysisConfig, budget: PlotBudget | None = None) -> None:
        # Shared with the run's other plotting hooks (analysis/build.py): together within it.
        self.budget = budget if budget is not None else PlotBudget()
        self.config = config
        settings = config.settings("worst_samples")
        assert isinstance(settings, WorstSamplesConfig)
        self.settings = settings
        self.enabled = config.enabled("worst_samples")
        self.trackers: list[LossHistory] = []
        self.pending: list[torch.Tensor] | None = None  # the validation pass under way
        self.dirty = False
        self._saved: dict[str, Any] = {}
        self._warned: set[str] = set()
        self.step_buffers: dict[str, StepBuffer] = {}  # per output, of the epoch under way
        self.buffered_epoch = -1

    # ---- events ----------------------------------------------------------------------------
    def before_train(self, run: RunView) -> None:
        self.budget.start()  # the plotting budget counts the run's time from its start
        if not self.enabled:
            return
        loader = run.train_data if self.settings.section == "training" else run.validation_data
        if loader is None:
            section = self.settings.section
            why = f"the run has no {section} section (analysis.worst_samples.section: {section})"
            say_skipped(run, ["worst_samples"], why)
            return
        size = len(loader.task)
        self.trackers = [LossHistory(o, size, run.device) for o in self.config.outputs]
        for tracker in self.trackers:
            saved = self._saved.get(tracker.output.name)
            if saved is not None and not tracker.load_state_dict(saved):
                run.log.warning(
                    "worst samples: the checkpoint's history of '%s' is for another data set "
                    "size; starting anew",
                    tracker.output.name,
                )

    def after_step(self, run: RunView, batch: Batch, loss: torch.Tensor) -> None:
        if self.settings.section != "training" or not self.trackers:
            return
        epoch = run.progress.epoch  # the epoch in progress (incremented when it ends)
        if self.buffered_epoch != epoch:  # held steps belong to their own epoch's row
            self.flush()
            self.buffered_epoch = epoch
        for tracker in self._usable(run, batch):
            buffer = self.step_buffers.get(tracker.output.name)
            if buffer is None:  # a block of steps at a time (see step_buffer)
                row = tracker.row_for_epoch(epoch)
                buffer = StepBuffer(lambda *block, t=tracker, r=row: t.observe_block(*block, r))
                self.step_buffers[tracker.output.name] = buffer
            out = tracker.output
            buffer.add(batch[out.predictions], batch[out.targets], batch[out.ids])
        self.dirty = True

    def flush(self) -> None:
        """Write the training steps held so far into their epoch's row of the history
        (reports and checkpoints flush first by themselves); the next step starts anew."""
        for buffer in self.step_buffers.values():
            buffer.flush()
        self.step_buffers.clear()

    def after_training_epoch(self, run: RunView, values: dict[str, Any]) -> None:
        self.flush()
        if self.settings.section == "training" and self.trackers:
            self.write(run)

    def eval_batch(self, run: RunView, section: str, batch: Batch) -> None:
        if section != self.settings.section or not self.trackers:
            return
        if self.pending is None:
            self.pending = [t.blank_row() for t in self.trackers]
        usable = self._usable(run, batch)
        for tracker, row in zip(self.trackers, self.pending, strict=True):
            if tracker in usable:
                tracker.observe(batch, row)

    def after_eval(self, run: RunView, section: str, values: dict[str, Any], partial: bool) -> None:
        if section != self.settings.section or not self.trackers:
            return
        pending, self.pending = self.pending, None
        if partial or pending is None:  # a partial pass covers a few batches: not an epoch
            return
        for tracker, row in zip(self.trackers, pending, strict=True):
            tracker.add_row(row, run.progress.epoch)
        self.dirty = True
        self.write(run)

    def after_train(self, run: RunView, summary: dict[str, Any]) -> None:
        self.flush()
        if self.dirty:  # figures left for the end, or interrupted mid-epoch
            self.write(run, force=True)

    def state_dict(self) -> dict[str, Any]:
        self.flush()
        if not self.trackers:
            return dict(self._saved)
        return {t.output.name: t.state_dict() for t in self.trackers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Restored before before_train knows the device and data set: adopted there.
        self._saved = dict(state)

    def _usable(self, run: RunView, batch: Batch) -> list[LossHistory]:
        usable = []
        for tracker in self.trackers:
            problem = tracker.problem(batch)
            if problem is None:
                usable.append(tracker)
            elif tracker.output.name not in self._warned:
                self._warned.add(tracker.output.name)
                say_skipped(run, [f"worst_samples (output '{tracker.output.name}')"], problem)
        return usable

    # ---- reports ---------------------------------------------------------------------------
    def write(self, run: RunView, force: bool = False) -> None:
        """worst.csv now; the heat map and the exported samples when the run's plotting
        budget allows (see plotting.PlotBudget), else at the end of the run."""
        budget = self.budget
        draw = force or budget.due("worst_samples")
        self.dirty = not draw
        folder = run.run_dir / "reports" / "worst_samples"
        folder.mkdir(parents=True, exist_ok=True)
        loader = run.train_data if self.settings.section == "training" else run.validation_data
        assert loader is not None
        for tracker in self.trackers:
            if not tracker.labels:
                continue
            prefix = "" if len(self.trackers) == 1 else f"{tracker.output.name}-"
            names = class_names(run.pipeline, tracker.output.class_names)
            worst = tracker.hardest(self.settings.count)
            _write_csv(folder / f"{prefix}worst.csv", worst, names)
            if not worst or not draw:
                continue
            ids = [row["id"] for row in worst]
            with budget.timed("worst_samples"):
                _write_heatmap(
                    folder / f"{prefix}heatmap.png",
                    tracker.history[:, ids].cpu(),
                    ids,
                    tracker.labels,
                    f"{tracker.output.name}: the {len(ids)} hardest "
                    f"{self.settings.section} samples",
                )
                for row in worst:  # as captions show them: the index, and the name if any
                    row["target_label"] = class_label(row["target"], names)
                    row["prediction_label"] = class_label(row["prediction"], names)
                self._export(run, loader.task, tracker.output, worst, folder, prefix)

    def _export(
        self,
        run: RunView,
        task: Any,
        output: OutputSpec,
        worst: list[dict[str, Any]],
        folder: Path,
        prefix: str,
    ) -> None:
        images, texts = image_key(task, output.images), task_key(task, output.texts)
        if images is None and texts is None:
            return
        # A fixed seed: a task with random transforms shows the same draw at every export.
        samples = fetch_samples(task, [row["id"] for row in worst], seed=run.seed)
        if images is not None:
            captions = [caption(row) for row in worst]
            save_grid([s[images] for s in samples], captions, folder / f"{prefix}worst.png")
        if texts is not None:
            lines = [
                "| id | cumulative loss | target | prediction | text |",
                "|---:|---:|---|---|---|",
            ]
            for row, sample in zip(worst, samples, strict=True):
                lines.append(
                    f"| {row['id']} | {row['cumulative_loss']:.4g} | {row['target_label']} "
                    f"| {row['prediction_label']} | {markdown_cell(sample[texts])} |"
                )
            write_text_atomic(folder / f"{prefix}worst.md", "\n".join(lines) + "\n")


def caption(row: dict[str, Any]) -> str:
    """A worst sample's caption: its id, its loss summed over the epochs, truth, prediction."""
    return (
        f"#{row['id']}\ntotal loss {row['cumulative_loss']:.3g}\n"
        f"true {row['target_label']}\npred {row['prediction_label']}"
    )


def _write_csv(path: Path, rows: list[dict[str, Any]], names: list[str] | None) -> None:
    columns = ["id", "cumulative_loss", "last_loss", "target", "prediction"]
    if names is not None:
        columns += ["target_name", "prediction_name"]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        line = {k: f"{v:.6g}" if isinstance(v, float) else v for k, v in row.items()}
        if names is not None:
            line["target_name"] = _name(row["target"], names)
            line["prediction_name"] = _name(row["prediction"], names)
        writer.writerow(line)
    write_text_atomic(path, buffer.getvalue())


def _name(index: int, names: list[str]) -> str:
    return names[index] if 0 <= index < len(names) else str(index)


def _write_heatmap(
    path: Path, losses: torch.Tensor, ids: list[int], labels: list[int], title: str
) -> None:
    """Epochs (rows) x samples (columns, hardest first); blank where a sample was not seen."""
    import matplotlib
    import numpy as np

    epochs, count = losses.shape
    # Margins fixed in inches (labels, colour bar): a fitted layout would draw it twice.
    fig = figure(min(4 + 0.3 * count, 20), min(2.5 + 0.3 * epochs, 12), (0.8, 0.9, 0.25, 0.4))
    axes = fig.add_subplot()
    colours = matplotlib.colormaps["magma"].with_extremes(bad="#dddddd")
    masked = np.ma.masked_invalid(losses.numpy())
    image = axes.imshow(masked, aspect="auto", cmap=colours, interpolation="nearest")
    fig.colorbar(image, ax=axes, label="loss")
    axes.set_xlabel("sample id (hardest first)")
    axes.set_ylabel("epoch")
    if count <= 64:
        axes.set_xticks(range(count), [str(i) for i in ids], rotation=90, fontsize=7)
    step = max(1, epochs // 20)
    axes.set_yticks(range(0, epochs, step), [str(v) for v in labels[::step]])
    axes.set_title(title, fontsize=10)
    save_png(fig, path)
