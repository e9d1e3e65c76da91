"""Worst samples: the loss of every sample, by its stable id, across epochs; the hardest ones.

For each analysed output, the per-sample cross entropy of its predictions against its targets
(the same for logits and log-probabilities, log_softmax being idempotent) is written by sample
id into a tensor [epochs, samples] (loss_history.py), one row per epoch (training: the
losses of the training steps; validation: of each full validation pass). That, the target and
the last prediction of each sample are all that is kept: ids and losses, never outputs. A step
costs a few device kernels and no host sync; the host reads the history once per epoch, to
write

    reports/worst_samples/heatmap.png   loss per epoch of the `count` hardest samples
    reports/worst_samples/worst.csv     id, cumulative loss, last loss, target, prediction
    reports/worst_samples/worst.png     their images (read from the task by id), captioned
    reports/worst_samples/worst.md      their texts, when the output names a texts stream

(with several outputs, each file name starts with `<output>-`). The history goes into
checkpoints, so a resumed run continues it.

With several processes the hook runs in each, which writes the losses of its share of every
batch; at a pass's end (and before a checkpoint) the processes exchange the samples they saw,
so that each holds the whole history, the one a single process would hold (one exchange per
pass, of the pass's ids and losses). Rank 0 writes the reports.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from torchloom.analysis.image_grid import (
    class_label,
    class_names,
    fetch_samples,
    image_key,
    markdown_cell,
    save_grid,
    task_key,
)
from torchloom.analysis.loss_history import LossHistory
from torchloom.analysis.plotting import PlotBudget, figure, save_png
from torchloom.analysis.schema import AnalysisConfig, OutputSpec, WorstSamplesConfig
from torchloom.analysis.skipped import say_skipped
from torchloom.analysis.step_buffer import StepBuffer
from torchloom.core.component import Batch
from torchloom.data.atomic_files import write_text_atomic
from torchloom.data.csv_cells import safe_mapping
from torchloom.engine.distributed import SINGLE, Distributed
from torchloom.engine.state import Hook

if TYPE_CHECKING:
    from torchloom.engine.state import RunView


class WorstSamples(Hook):
    """Tracks per-sample losses of the configured section and exports the hardest samples."""

    name = "worst_samples"
    every_rank = True  # each process writes its share's losses; exchanged at each pass's end

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
        # Whether the training row holds every process's steps so far: the epoch's end and
        # the checkpoints that follow it (last.pt, best.pt) need one exchange, not three.
        self.row_merged = False
        self.distributed: Distributed = SINGLE  # the run's, from before_train

    # ---- events ----------------------------------------------------------------------------
    def before_train(self, run: RunView) -> None:
        self.budget.start()  # the plotting budget counts the run's time from its start
        self.distributed = run.distributed
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
        self.row_merged = False  # every process takes the same steps: set alike in each
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
            self._merge_training_row()
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
        if partial:  # a partial pass covers a few batches: not an epoch
            return
        if pending is None:  # no batch of the pass; one of several processes takes part
            if not self.distributed.active:
                return
            pending = [t.blank_row() for t in self.trackers]
        self._merge(pending)
        for tracker, row in zip(self.trackers, pending, strict=True):
            tracker.add_row(row, run.progress.row_epoch)
        self.dirty = True
        self.write(run)

    def after_train(self, run: RunView, summary: dict[str, Any]) -> None:
        self.flush()
        if self.settings.section == "training" and self.trackers:
            # A run that diverged mid-epoch ends here, with neither the epoch's end nor a
            # checkpoint: its last steps are merged now. Every process, dirty or not.
            self._merge_training_row()
        if self.dirty:  # figures left for the end, or interrupted mid-epoch
            self.write(run, force=True)

    def state_dict(self) -> dict[str, Any]:
        self.flush()
        if not self.trackers:
            return dict(self._saved)
        if self.settings.section == "training":  # the epoch so far, of every process
            self._merge_training_row()
        return {t.output.name: t.state_dict() for t in self.trackers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Restored before before_train knows the device and data set: adopted there.
        self._saved = dict(state)

    def _merge_training_row(self) -> None:
        """The row of the training epoch under way (or just ended) made every process's."""
        if self.row_merged:
            return
        epoch = self.buffered_epoch  # the same in every process: they take the same steps
        self._merge([t.row(epoch) for t in self.trackers])
        self.row_merged = True

    def _merge(self, rows: Sequence[torch.Tensor | None]) -> None:
        """Every process's losses of a pass in `rows` (one per tracker; None where it has
        none), with their targets and predictions: each process wrote its share's samples,
        and after this each holds them all. A collective: every process calls it at the same
        events, whatever data it had."""
        if not self.distributed.active:
            return
        mine = [
            None if row is None else tracker.seen_in(row)
            for tracker, row in zip(self.trackers, rows, strict=True)
        ]
        for theirs in self.distributed.gather(mine):
            for tracker, row, seen in zip(self.trackers, rows, theirs, strict=True):
                if row is not None and seen is not None:
                    tracker.adopt(row, seen)

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
        budget allows (see plotting.PlotBudget), else at the end of the run. Rank 0 alone
        writes: every process holds the same history."""
        if not self.distributed.main:
            return
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
            names = class_names(run.pipeline, tracker.output)
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
                    f"| {row['id']} | {row['cumulative_loss']:.4g} "
                    f"| {markdown_cell(row['target_label'])} "
                    f"| {markdown_cell(row['prediction_label'])} | {markdown_cell(sample[texts])} |"
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
        writer.writerow(safe_mapping(line))  # class names and ids: user text
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
