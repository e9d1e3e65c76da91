"""Where a run's numbers go: CSV files, TensorBoard, run.log, the progress bar.

Rows are written at the logging interval and at the end of each pass; nothing here reads a
device value more often than that.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from torchloom.core.pipeline import Pipeline
from torchloom.engine.distributed import whole
from torchloom.statistics.csv_log import CsvLog

LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"
COMPONENT_LOGGERS = ("torchloom.viewer", "torchloom.data")


class RunLogHandler(logging.FileHandler):
    """run.log. A line that cannot be written (a full disk) is dropped quietly: logging's
    default prints a traceback per line, and the error that matters reaches the user anyway
    through the write that fails next (a checkpoint, a statistics row)."""

    def handleError(self, record: logging.LogRecord) -> None:
        self.dropped = getattr(self, "dropped", 0) + 1


def make_logger(run_dir: Path, quiet: bool, writing: bool = True) -> logging.Logger:
    """The run's logger: run.log and the console. `writing` False (a process other than
    rank 0 of several): no file, and errors only on the console, prefixed (none when
    `quiet`: `loom train --nproc` says which rank failed, once)."""
    logger = logging.getLogger(f"torchloom.run.{run_dir}" + ("" if writing else ".rank"))
    logger.setLevel(logging.INFO if writing else logging.ERROR)
    logger.propagate = False
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    if not writing:
        console: logging.Handler = logging.NullHandler()
        if not quiet:
            console = logging.StreamHandler(sys.stderr)
            console.setFormatter(logging.Formatter("[worker] %(message)s"))
        logger.addHandler(console)
        return logger
    file_handler = RunLogHandler(run_dir / "run.log", encoding="utf-8")
    file_handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logger.addHandler(file_handler)
    if not quiet:
        console = logging.StreamHandler(sys.stderr)
        console.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(console)
    # Components log to their own loggers (StreamViewer: "torchloom.viewer"); during a run
    # their lines go where the run's go.
    for name in COMPONENT_LOGGERS:
        component_logger = logging.getLogger(name)
        component_logger.setLevel(logging.INFO)
        component_logger.propagate = False
        for handler in logger.handlers:
            component_logger.addHandler(handler)
    return logger


def close_logger(logger: logging.Logger) -> None:
    for handler in list(logger.handlers):
        for name in COMPONENT_LOGGERS:
            logging.getLogger(name).removeHandler(handler)
        handler.close()
        logger.removeHandler(handler)
    # `logging` keeps every named logger for the life of the process; a search in one process
    # makes one per trial.
    logging.Logger.manager.loggerDict.pop(logger.name, None)


class Reporter:
    """CSV + TensorBoard + log for one run folder. `tensorboard`: 0 off, 1 scalars,
    2 scalars and weight/gradient histograms."""

    FILES = (
        "training_statistics",
        "training_epoch_statistics",
        "validation_statistics",
        "validation_epoch_statistics",
    )

    def __init__(
        self,
        run_dir: Path,
        logger: logging.Logger,
        tensorboard: int = 1,
        resume_episode: int | None = None,
        resume_rows: dict[str, int] | None = None,
        writing: bool = True,
    ) -> None:
        """`resume_episode` and `resume_rows` (the row counts a checkpoint recorded) cut the
        CSV files back to what they held when the checkpoint was saved. `writing` False: a
        process other than rank 0 of several, which writes nothing."""
        self.run_dir, self.logger = run_dir, logger
        self.tensorboard_level = tensorboard if writing else 0
        # Every process takes part in gathering sharded (FSDP) weights; rank 0 writes them.
        self.histograms_wanted = tensorboard >= 2
        self.writing = writing
        rows = resume_rows or {}
        self.csv = {
            name: CsvLog(run_dir / f"{name}.csv", resume_episode, rows.get(name))
            for name in (self.FILES if writing else ())
        }
        self._writer: Any = None
        self._resume_episode = resume_episode

    def open(self) -> None:
        """Open the TensorBoard writer now, before the first training step: importing
        tensorboard takes a twentieth to a tenth of a second, which would otherwise fall on
        the step that logs the first row, a hundred steps into the loop."""
        _ = self.writer

    @property
    def writer(self) -> Any:
        if self._writer is None and self.tensorboard_level > 0:
            # Imported on first use: tensorboard is slow to import and not always needed.
            from torch.utils.tensorboard import SummaryWriter

            # Purged from the checkpoint's episode on, that episode included: rows written
            # there after the save (an epoch's, when the save fell on its last step) come
            # again; those written before it, which the cut CSV files keep, are written back.
            resumed = self._resume_episode
            self._writer = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=resumed)
            if resumed is not None:
                self._write_back(resumed)
        return self._writer

    def _write_back(self, episode: int) -> None:
        for file, log in self.csv.items():
            for row in log.rows(episode):
                numbers = {key: _number(value) for key, value in row.items()}
                kept = {key: value for key, value in numbers.items() if value is not None}
                self._scalars(file, kept, episode)

    def row_counts(self) -> dict[str, int]:
        """Rows in each CSV file now: a checkpoint records them (see CsvLog)."""
        return {name: log.count for name, log in self.csv.items()}

    def row(self, file: str, row: dict[str, Any], episode: int) -> None:
        if not self.writing:
            return
        self.csv[file].write(row)
        if self.writer is not None:
            self._scalars(file, row, episode)

    def _scalars(self, file: str, row: Mapping[str, Any], episode: int) -> None:
        section = file.replace("_statistics", "").replace("_epoch", "/epoch")
        for key, value in row.items():
            if isinstance(value, (int, float)) and key not in ("episode", "epoch"):
                self.writer.add_scalar(f"{section}/{key}", value, episode)

    def histograms(self, pipeline: Pipeline, episode: int) -> None:
        """Weight and gradient histograms per component (`--tensorboard 2`) of their finite
        values; called at an optimizer step, before the gradients are cleared."""
        if not self.histograms_wanted:
            return
        for component, module in pipeline.components.items():
            for name, parameter in module.named_parameters():
                tag = f"{component}/{name}"
                weights = whole(parameter.detach())
                gradient = None if parameter.grad is None else whole(parameter.grad.detach())
                if self.writer is None:
                    continue
                for kind, values in (("weights", weights), ("gradients", gradient)):
                    if values is None:
                        continue
                    # An fp16 step whose gradients overflowed (the scaler skips it) leaves inf
                    # and NaN, which TensorBoard cannot bin: the finite values are drawn.
                    host = values.cpu().float()
                    finite = host[host.isfinite()]
                    if finite.numel():
                        self.writer.add_histogram(f"{kind}/{tag}", finite, episode)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def progress_bar(total: int, epoch: int, enabled: bool, initial: int = 0) -> tqdm[Any] | None:
    """A bar per epoch, redrawn at most twice a second; none when not on a terminal."""
    if not enabled or not sys.stderr.isatty():
        return None
    return tqdm(
        total=total,
        initial=initial,
        desc=f"epoch {epoch + 1}",
        unit="batch",
        mininterval=0.5,
        leave=False,
        dynamic_ncols=True,
    )


def format_statistics(values: dict[str, Any]) -> str:
    shown = [
        f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
        for k, v in values.items()
        if not k.endswith(("_min", "_max", "_std")) and k not in ("epoch", "episode")
    ]
    return ", ".join(shown)


def tensor_item(value: torch.Tensor | float) -> float:
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


def log_build_notes(log: logging.Logger, pipeline: Pipeline) -> None:
    """What components noted while they were built (before the run had a log)."""
    for name, component in [*pipeline.tasks.items(), *pipeline.components.items()]:
        for message in component.build_notes:
            log.info("%s: %s", name, message)


def _number(text: Any) -> float | None:
    """A CSV cell as the number it was written from; None for text or an empty cell."""
    try:
        return float(text)
    except (TypeError, ValueError):
        return None
