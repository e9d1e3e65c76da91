"""The training worker: offline (validate after every epoch) and online (partial validation
every N episodes). `train_epoch` is the whole loop; set-up, checkpoints and reporting live in
helpers so the loop reads top to bottom on one screen.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from torchloom.core.weights import load_pipeline_weights
from torchloom.engine.checkpoint import load_checkpoint, save_checkpoint
from torchloom.engine.compilation import running_eagerly
from torchloom.engine.divergence import Diverged
from torchloom.engine.evaluation import (
    PassInterrupted,
    evaluate,
    statistic_values,
    statistics_copy,
)
from torchloom.engine.loaders import to_device
from torchloom.engine.losses import batch_size_of
from torchloom.engine.reporting import format_statistics, progress_bar
from torchloom.engine.run_state import RunState
from torchloom.engine.seeding import capture_rng_state
from torchloom.engine.summary import RunResult, write_running, write_summary
from torchloom.engine.terminal import Status, converged, limit_reached
from torchloom.errors import LoomError, StorageError
from torchloom.statistics.csv_log import CsvLog


class Trainer:
    """Runs one `RunState` (built by `training_setup.prepare_training`) to its end; hooks
    (analysis, viewers) observe it through the events in `engine/hooks.py`."""

    def __init__(self, state: RunState) -> None:
        self.s = state
        # The epoch whose data was trained on last: validation visits that epoch's data, which
        # matters when its sampler changes with the epoch (k-fold's held-out fold rotates).
        self.trained_epoch = max(state.progress.epoch - 1, 0)
        self.histogram_episode = state.progress.episode
        self.first_batch_of_session = True

    # ---- the loop --------------------------------------------------------------------------
    def train_epoch(self) -> Status | None:
        s, p = self.s, self.s.progress
        self.trained_epoch = p.epoch
        loader = s.train_data.epoch(p.epoch, start_batch=p.batch_in_epoch)
        bar = progress_bar(
            s.train_data.batches_per_epoch(), p.epoch, s.show_progress, p.batch_in_epoch
        )
        s.pipeline.train()
        if p.episode == 0 or self.first_batch_of_session:
            s.pipeline.check_next_batch("training")  # the first batch, against every spec
            self.first_batch_of_session = False
        status = None
        for batch in loader:
            batch = to_device(batch, s.device)
            # Compiled models run eagerly for a step a hook observes through forward hooks.
            eager = bool(s.compiled_models) and s.hooks.needs_eager_step(s)
            with running_eagerly(eager), s.precision.autocast():
                s.pipeline(batch)
                loss = s.loss(batch)
            s.guard.check(loss, batch, p.episode + 1)
            s.precision.backward(loss / s.accumulation if s.accumulation > 1 else loss)
            p.episode += 1
            p.batch_in_epoch += 1
            if p.batch_in_epoch % s.accumulation == 0:
                self.optimizer_step()
            self.record_step(batch, loss, bar)
            status = self.after_step()
            if status is not None:
                break
        ran_to_end = status is None or (
            status is not Status.INTERRUPTED
            and p.batch_in_epoch >= s.train_data.batches_per_epoch()
        )
        if ran_to_end:
            if p.batch_in_epoch % s.accumulation:
                self.optimizer_step()  # the last, shorter accumulation window
            p.epoch, p.batch_in_epoch = p.epoch + 1, 0
        if bar is not None:
            bar.close()
        return self.end_epoch(status)

    def optimizer_step(self) -> None:
        s = self.s
        s.precision.step(s.optimizer, s.parameters)
        if s.progress.episode - self.histogram_episode >= s.config.logging_interval:
            s.reporter.histograms(s.pipeline, s.progress.episode)  # while gradients exist
            self.histogram_episode = s.progress.episode
        s.optimizer.zero_grad(set_to_none=True)
        if s.scheduler is not None and s.scheduler_interval == "step":
            s.scheduler.step()

    # ---- what happens around the loop ------------------------------------------------------
    def record_step(self, batch: dict[str, Any], loss: torch.Tensor, bar: Any) -> None:
        s, p = self.s, self.s.progress
        s.interval_loss.add(loss)
        s.epoch_loss.add(loss)
        s.pipeline.update_statistics(batch, s.train_statistics)
        s.pipeline.update_statistics(batch, s.interval_statistics)
        s.interval_samples += batch_size_of(batch)
        if s.hooks:
            s.hooks.after_step(s, batch, loss)
        if bar is not None:
            bar.update(1)
        if p.episode % s.config.logging_interval == 0:
            elapsed = max(time.perf_counter() - s.interval_started, 1e-9)
            row = {
                "episode": p.episode,
                "epoch": p.epoch + 1,  # the epoch in progress, numbered as in epoch rows
                **s.interval_loss.values("loss"),
                "batch_size": batch_size_of(batch),
                "samples_per_second": s.interval_samples / elapsed,
                # over this interval's batches, as the loss (the epoch's are in epoch rows)
                **statistic_values(s.interval_statistics),
            }
            s.reporter.row("training_statistics", row, p.episode)
            if bar is not None:
                bar.set_postfix(
                    loss=f"{row['loss']:.4f}", samples_s=f"{row['samples_per_second']:.0f}"
                )
            s.interval_loss.reset()
            for statistic in s.interval_statistics.values():
                statistic.reset()
            s.interval_samples, s.interval_started = 0, time.perf_counter()
            s.hooks.after_interval(s)

    def after_step(self) -> Status | None:
        s, p = self.s, self.s.progress
        if s.stop_requested():
            return Status.INTERRUPTED
        status = None
        if s.online and p.episode % s.partial_interval == 0:
            status = self.validate(partial=True)
        if s.config.checkpoint_interval and p.episode % s.config.checkpoint_interval == 0:
            self.save("last.pt")
        limit = limit_reached(s.config.terminal_conditions, p.epoch, p.episode)
        return status or (limit if limit is Status.EPISODE_LIMIT else None)

    def end_epoch(self, status: Status | None) -> Status | None:
        s, p = self.s, self.s.progress
        if status is Status.INTERRUPTED:  # mid-epoch: running statistics go into last.pt as is
            return status
        row = {
            "epoch": p.epoch,
            "episode": p.episode,
            **s.epoch_loss.values("loss"),
            **statistic_values(s.train_statistics),
            "lr": s.optimizer.param_groups[0]["lr"],
        }
        s.latest["training"] = {f"training.{k}": v for k, v in row.items()}
        s.hooks.after_training_epoch(s, row)
        s.reporter.row("training_epoch_statistics", row, p.episode)
        s.log.info("epoch %d (episode %d) training: %s", p.epoch, p.episode, format_statistics(row))
        s.epoch_loss.reset()
        for statistic in s.train_statistics.values():
            statistic.reset()
        if s.scheduler is not None and s.scheduler_interval == "epoch":
            s.scheduler.step()
        if not s.online and s.validation_data is not None:
            status = self.validate(partial=False) or status
        elif not s.online:
            status = self.judge(s.latest["training"]) or status
        self.save("last.pt")
        return status or limit_reached(s.config.terminal_conditions, p.epoch, p.episode)

    def validate(self, partial: bool) -> Status | None:
        """Validation pass; updates best.pt and says whether the run should stop."""
        s, p = self.s, self.s.progress
        if s.validation_data is None:
            return None
        batches = s.partial_batches if partial else None
        s.pipeline.check_next_batch("validation")
        values = evaluate(
            s.pipeline,
            s.validation_data.epoch(self.trained_epoch),
            s.validation_statistics,
            s.loss,
            s.precision,
            s.device,
            max_batches=batches,
            observe=(lambda batch: s.hooks.eval_batch(s, "validation", batch)) if s.hooks else None,
        )
        s.hooks.after_eval(s, "validation", values, partial)
        kind = "validation_statistics" if partial else "validation_epoch_statistics"
        # Numbered as every row: the epoch the values were measured in, from 1 (mid-epoch
        # partial validations belong to the epoch in progress).
        epoch = p.epoch + 1 if p.batch_in_epoch else p.epoch
        s.reporter.row(kind, {"epoch": epoch, "episode": p.episode, **values}, p.episode)
        s.log.info(
            "epoch %d (episode %d) validation%s: %s",
            epoch,
            p.episode,
            " (partial)" if partial else "",
            format_statistics(values),
        )
        s.latest["validation"] = {f"validation.{k}": v for k, v in values.items()}
        return self.judge({**s.latest.get("training", {}), **s.latest["validation"]})

    def judge(self, statistics: dict[str, float]) -> Status | None:
        s, p = self.s, self.s.progress
        if s.monitor.update(statistics, p.epoch):
            s.best_statistics = {
                k: v for k, v in statistics.items() if not k.endswith((".epoch", ".episode", ".lr"))
            }
            self.save("best.pt")
        if converged(s.config.terminal_conditions, statistics, s.validation_data is not None):
            return Status.CONVERGED
        if s.monitor.exhausted:
            return Status.EARLY_STOPPED
        return None

    def save(self, name: str) -> None:
        s = self.s
        save_checkpoint(
            s.run_dir / "checkpoints" / name,
            {
                "components": s.pipeline.component_states(),
                "optimizer": s.optimizer.state_dict(),
                "scheduler": s.scheduler.state_dict() if s.scheduler is not None else None,
                "precision": s.precision.state_dict(),
                "rng": capture_rng_state(),
                "progress": s.progress_state(),
                "monitor": s.monitor.state_dict(),
                "best_statistics": s.best_statistics,
                "running": s.running_state(),
                "hooks": s.hooks.state_dict(),
                "config": s.config_text,
            },
            keep_previous=name == "last.pt",
        )

    def test(self) -> dict[str, float]:
        """The test section, evaluated with the best weights (the last ones if none are
        best); stops at a signal (nothing to save: a resumed run repeats it)."""
        s, p = self.s, self.s.progress
        assert s.test_data is not None
        best = s.run_dir / "checkpoints" / "best.pt"
        s.log.info("test pass with %s", "best.pt" if best.exists() else "the last weights")
        if best.exists():
            load_pipeline_weights(
                s.pipeline.components, load_checkpoint(best)["components"], f"'{best}'"
            )
        s.pipeline.check_next_batch("test")
        values = evaluate(
            s.pipeline,
            s.test_data.epoch(0),
            statistics_copy(s.pipeline, s.device),
            s.loss,
            s.precision,
            s.device,
            observe=(lambda batch: s.hooks.eval_batch(s, "test", batch)) if s.hooks else None,
            stop=s.stop_requested,
        )
        s.hooks.after_eval(s, "test", values, False)
        # A pass repeated at the same episode (a run killed after its test pass, resumed)
        # replaces its row instead of adding a second one.
        CsvLog(s.run_dir / "test_statistics.csv", keep_until_episode=p.episode - 1).write(
            {"epoch": p.epoch, "episode": p.episode, **values}
        )
        s.log.info("test: %s", format_statistics(values))
        return values

    # ---- start to end ----------------------------------------------------------------------
    def run(self) -> RunResult:
        """Train, validate and test to the end, and write summary.json however the run ends:
        finished, stopped by a signal, diverged, or failed with an exception (its one-line
        message is the summary's reason). The run folder's lock is released in every case."""
        s = self.s
        try:
            result, diverged = self._run()
        except BaseException as error:
            status = Status.INTERRUPTED if isinstance(error, KeyboardInterrupt) else Status.FAILED
            reason = (
                "stopped at once by a second signal; last.pt holds the last save"
                if status is Status.INTERRUPTED
                else failure_reason(error)
            )
            s.log.error("%s: %s", status.value, reason)
            try:
                write_summary(s, status, reason, None)
            except Exception as secondary:  # a full disk: the first error is what matters
                s.log.error("summary.json could not be written: %s", secondary)
            if isinstance(error, OSError) and not isinstance(error, LoomError):
                raise StorageError.from_os(error.filename or s.run_dir, error) from error
            raise
        finally:
            s.close()
        if diverged is not None:
            raise diverged  # after the summary says so: the CLI exits 2 with its message
        return result

    def _run(self) -> tuple[RunResult, Diverged | None]:
        s = self.s
        s.log.info(
            "training '%s' on %s, seed %d, run folder %s", s.name, s.device, s.seed, s.run_dir
        )
        write_running(s.run_dir, s.name)
        # Signals stop the run gracefully from here to the end, final test pass included.
        with s.signals:
            for component in s.pipeline.components.values():
                component.begin_pass("training", s.run_dir)  # viewers write into the run folder
            s.hooks.before_train(s)
            started = time.perf_counter()
            status = limit_reached(
                s.config.terminal_conditions, s.progress.epoch, s.progress.episode
            )
            diverged: Diverged | None = None
            try:
                while status is None:
                    status = self.train_epoch()
            except Diverged as error:
                status, diverged = Status.DIVERGED, error
            if status is Status.INTERRUPTED:
                self.save("last.pt")
                s.log.info(
                    "interrupted: last.pt saved; continue with `loom train --resume %s`",
                    s.run_dir,
                )
            elif status is not Status.DIVERGED and s.online and s.validation_data is not None:
                self.validate(partial=False)
            for component in s.pipeline.components.values():
                component.end_pass()
            training_seconds = time.perf_counter() - started
            s.hooks.training_ended()
            reason = diverged.format() if diverged is not None else status.reason
            test = None
            if s.test_data is not None and status.finished and status is not Status.DIVERGED:
                try:
                    test = self.test()
                except PassInterrupted:
                    status = Status.INTERRUPTED
                    reason = "stopped by a signal during the final test pass; --resume runs it"
                    s.log.info("interrupted during the test pass: %s", reason)
            result = write_summary(s, status, reason, test)
            s.hooks.after_train(s, result.summary)
        if s.hooks:
            s.log.info(
                "analysis took %.1f s of the %.1f s of training (%.1f%%), and %.1f s after it",
                s.hooks.in_training,
                training_seconds,
                100 * s.hooks.in_training / max(training_seconds, 1e-9),
                s.hooks.total() - s.hooks.in_training,
            )
        if diverged is not None:
            kept = (s.run_dir / "checkpoints" / "best.pt").exists()
            s.log.error("%s%s", diverged.format(), "; best.pt is intact" if kept else "")
        return result, diverged


def failure_reason(error: BaseException) -> str:
    """One line saying what ended a run: a user error's message, else the exception's type
    and the first line of its message."""
    if isinstance(error, LoomError):
        return error.format().splitlines()[0]
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
