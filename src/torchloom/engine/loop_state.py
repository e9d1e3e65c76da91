"""The training loop's state: the figures it keeps between steps, what a checkpoint holds of
a run (everything exact resume needs), and what summary.json says of it.

Kept apart from the loop (engine/trainer.py), which reads top to bottom as a hand-written
loop would; what changes with the checkpoint format changes here. A checkpoint's random
generators are restored last, so that nothing drawn while restoring shifts the resumed run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from torchloom.core.component import Batch
from torchloom.core.weights import load_pipeline_weights
from torchloom.engine import sharded
from torchloom.engine.checkpoint import (
    capture_rng_state,
    restore_rng_state,
    save_checkpoint,
    seed_everything,
)
from torchloom.engine.distributed import average_gradients
from torchloom.engine.evaluation import TrainingStatistics
from torchloom.engine.run_folder import Status
from torchloom.engine.state import Progress, RunSetup
from torchloom.statistics.accumulators import RunningStats


@dataclass
class LoopMeters:
    """The running loss and statistics of the epoch and of the logging interval, and the
    latest and best values of every section."""

    train_statistics: TrainingStatistics
    epoch_loss: RunningStats = field(default_factory=RunningStats)
    interval_loss: RunningStats = field(default_factory=RunningStats)
    interval_samples: int = 0
    latest: dict[str, dict[str, float]] = field(default_factory=dict)
    best_statistics: dict[str, float] = field(default_factory=dict)
    interval_started: float = field(default_factory=time.perf_counter)  # saved as seconds

    def add_step(self, loss: torch.Tensor, batch: Batch, samples: int) -> None:
        """A trained batch of `samples` samples over every process, and its (detached) loss."""
        self.interval_loss.add(loss, samples)  # the loss over samples: a batch weighs its own
        self.epoch_loss.add(loss, samples)
        self.train_statistics.update(batch)
        self.interval_samples += samples

    def interval_row(self, progress: Progress, batch_size: int) -> dict[str, float]:
        """The logging interval's row (training_statistics.csv); starts the next interval."""
        elapsed = max(time.perf_counter() - self.interval_started, 1e-9)
        row = {
            "episode": progress.episode,
            "epoch": progress.row_epoch,
            **self.interval_loss.values("loss"),
            "batch_size": batch_size,
            "samples_per_second": self.interval_samples / elapsed,
            # over this interval's batches, as the loss (the epoch's are in epoch rows)
            **self.train_statistics.interval_values(),
        }
        self.interval_loss.reset()
        self.interval_samples, self.interval_started = 0, time.perf_counter()
        return row

    def epoch_row(self, progress: Progress, lr: float) -> dict[str, float]:
        """The epoch's row (training_epoch_statistics.csv), from now on the latest training
        values; starts the next epoch's meters."""
        row = {
            "epoch": progress.row_epoch,
            "episode": progress.episode,
            **self.epoch_loss.values("loss"),
            **self.train_statistics.epoch_values(),
            "lr": lr,
        }
        self.latest["training"] = {f"training.{k}": v for k, v in row.items()}
        self.epoch_loss.reset()
        self.train_statistics.end_epoch()
        return row


def checkpoint_state(
    setup: RunSetup, progress: Progress, meters: LoopMeters, wall_time: float
) -> dict[str, Any]:
    """Everything exact resume needs (engine/checkpoint.py). With several processes, every
    one calls it: the random generators of all are gathered. A step whose divergence check
    is still pending (on a GPU) is read first: no checkpoint holds weights a bad loss made."""
    setup.guard.settle()
    mid_window = progress.batch_in_epoch % setup.accumulation
    if mid_window and setup.distributed.active and not setup.sharded:
        average_gradients(setup.parameters, setup.distributed)  # no_sync kept them apart
    search = setup.architecture_search
    return {
        "components": None if setup.sharded else setup.pipeline.component_states(),
        "optimizer": None if setup.sharded else setup.optimizer.state_dict(),
        "scheduler": setup.scheduler.state_dict() if setup.scheduler is not None else None,
        "precision": setup.precision.scaler.state_dict(),
        "rng": capture_rng_state(setup.device),
        # Every process's generators, for exact resume at the same number of processes.
        "rng_ranks": setup.distributed.gather(capture_rng_state(setup.device))
        if setup.distributed.active
        else None,
        "progress": {**progress.state_dict(), "wall_time": wall_time},
        "monitor": setup.monitor.state_dict(),
        "best_statistics": meters.best_statistics,
        "running": {
            "epoch_loss": meters.epoch_loss.state_dict(),
            "interval_loss": meters.interval_loss.state_dict(),
            "interval_samples": meters.interval_samples,
            "interval_seconds": time.perf_counter() - meters.interval_started,
            **meters.train_statistics.state_dict(),
            "latest": meters.latest,
            "csv_rows": setup.reporter.row_counts(),
            "reservoir": setup.train_data.reservoir_state(),
            # Gradients summed so far in an unfinished accumulation window (a save between
            # two optimizer steps): without them a resumed run would step on fewer batches.
            "gradients": [p.grad for p in setup.parameters]
            if mid_window and not setup.sharded
            else None,
        },
        "hooks": setup.hooks.state_dict(),
        "architecture_search": search.state_dict() if search is not None else None,
        "config": setup.config_text,
        "config_written": setup.config_written,
    }


def save_state(setup: RunSetup, progress: Progress, state: dict[str, Any], name: str) -> None:
    """Write `state` as checkpoints/NAME; under FSDP, last.pt's weights go to shards that
    every process writes its part of (engine/sharded.py), best.pt's whole."""
    folder = setup.run_dir / "checkpoints"
    if setup.sharded:
        state = sharded.checkpoint_state(
            state,
            folder,
            setup.pipeline.registered,
            setup.optimizer,
            setup.distributed,
            last=name == "last.pt",
            gradients=bool(progress.batch_in_epoch % setup.accumulation),
        )
    if setup.distributed.main:
        save_checkpoint(folder / name, state, keep_previous=name == "last.pt")
        if setup.sharded and name == "last.pt":
            sharded.prune_unused(folder)


def restore_state(
    setup: RunSetup, progress: Progress, meters: LoopMeters, checkpoint: dict[str, Any]
) -> None:
    """Put a checkpoint's states back into the run being set up, random generators last."""
    source = f"checkpoint of {setup.run_dir}"
    record = checkpoint.get(sharded.RECORD)
    if record is not None:  # FSDP: each process reads its shards, at any world size
        folder = setup.run_dir / "checkpoints"
        sharded.load_shards(
            folder, record, setup.pipeline.registered, setup.optimizer, setup.distributed
        )
    else:
        load_pipeline_weights(setup.pipeline.components, checkpoint["components"], source)
        setup.optimizer.load_state_dict(checkpoint["optimizer"])
    if setup.scheduler is not None and checkpoint["scheduler"] is not None:
        setup.scheduler.load_state_dict(checkpoint["scheduler"])
    scaler = setup.precision.scaler
    scaler.load_state_dict(checkpoint["precision"])
    if scaler.is_enabled():
        # load_state_dict keeps the scale for later: a resumed run whose first act is the
        # epoch's leftover window step (a stop on its last batch) unscaled with none.
        scaler.scale(torch.zeros((), device=setup.device))
    progress.load_state_dict(checkpoint["progress"])
    if progress.episode >= setup.accumulation:
        # The optimizer stepped before the save; torch's flag for it is not in its state, and
        # a resumed epoch-end schedule step warned "lr_scheduler.step() before optimizer.step()".
        setup.optimizer._opt_called = True  # type: ignore[attr-defined]
    setup.monitor.load_state_dict(checkpoint["monitor"])
    meters.best_statistics = checkpoint["best_statistics"]
    running = checkpoint["running"]
    meters.epoch_loss.load_state_dict(running["epoch_loss"], setup.device)
    meters.interval_loss.load_state_dict(running["interval_loss"], setup.device)
    # The interval's rate divides its samples by its time, both over the sessions (a
    # checkpoint from before the time was saved: the samples of this session alone).
    seconds = running.get("interval_seconds")
    meters.interval_samples = running["interval_samples"] if seconds is not None else 0
    meters.interval_started = time.perf_counter() - (seconds or 0.0)
    meters.train_statistics.load_state_dict(running)
    if running.get("gradients") is not None:
        for parameter, gradient in zip(setup.parameters, running["gradients"], strict=True):
            parameter.grad = None if gradient is None else gradient.to(parameter.device)
    meters.latest = running["latest"]
    note = setup.train_data.load_reservoir_state(running.get("reservoir"))
    if note is not None:
        setup.log.warning("%s", note)
    setup.hooks.load_state_dict(checkpoint.get("hooks", {}))
    if setup.architecture_search is not None:
        setup.architecture_search.load_state_dict(checkpoint["architecture_search"])
    dist, ranks = setup.distributed, checkpoint.get("rng_ranks")
    if ranks is not None and len(ranks) == dist.world:
        restore_rng_state(ranks[dist.rank], setup.device)
    elif dist.main:
        restore_rng_state(checkpoint["rng"], setup.device)
    else:  # saved by another number of processes: rank 0 continues, the others anew
        seed_everything(setup.seed + dist.rank + 7919 * progress.episode)


def run_summary(
    setup: RunSetup,
    progress: Progress,
    meters: LoopMeters,
    status: Status,
    reason: str,
    test: dict[str, float] | None,
    wall_time: float,
) -> dict[str, Any]:
    """summary.json's content for a run that ended with `status` (engine/run_folder.py)."""
    monitor = setup.monitor
    final = {
        section: {k.split(".", 1)[1]: v for k, v in values.items()}
        for section, values in meters.latest.items()
    }
    if test is not None:
        final["test"] = test
    return {
        "pipeline": setup.name,
        "status": status.value,
        "reason": reason,
        "epochs": progress.epoch,
        "episodes": progress.episode,
        "wall_time_seconds": round(wall_time, 3),
        "seed": setup.seed,
        "device": str(setup.device),
        "monitor": {
            "name": monitor.name,
            "mode": monitor.mode,
            "best": monitor.best,
            "best_epoch": monitor.best_epoch,
        },
        "best": meters.best_statistics,
        "final": final,
    }
