"""The training loop: offline (validate after every epoch) or online (partial validation
every N episodes), to the end of a run, however it ends. `train_epoch` is the loop and
`train_step` / `optimizer_step` the step, in the order of a hand-written loop: forward, loss,
divergence check, backward, then every `accumulation` batches unscale, clip, step, zero_grad
and the per-step scheduler. The rest (rows, hooks, validation, checkpoints, the test pass
(engine/final_test.py), summary.json) happens around them; what a checkpoint holds of the loop
is in engine/loop_state.py."""

from __future__ import annotations

import time
from typing import Any

import torch

from torchloom.engine.checkpoint import seed_everything
from torchloom.engine.distributed import gradient_sync
from torchloom.engine.evaluation import (
    PassInterrupted,
    TrainingStatistics,
    evaluate,
    statistics_copy,
)
from torchloom.engine.final_test import run_test_pass
from torchloom.engine.loaders import to_device
from torchloom.engine.loop_state import (
    LoopMeters,
    checkpoint_state,
    restore_state,
    run_summary,
    save_state,
)
from torchloom.engine.reporting import close_logger, format_statistics, progress_bar
from torchloom.engine.run_folder import (
    RunResult,
    Status,
    as_user_error,
    failure_reason,
    read_started_by,
    stopped_at_once_reason,
    write_running,
    write_summary,
)
from torchloom.engine.state import Progress, RunSetup, RunView
from torchloom.engine.step import Diverged, batch_size_of, clip_gradients, running_eagerly
from torchloom.engine.terminal import judged_end, limit_inside_a_window, limit_reached, resumed_end


class TrainingLoop:
    """Runs one `RunSetup` (engine/setup.py) to its end, from its start or from a checkpoint;
    hooks (analysis, viewers) observe it through a `RunView` (engine/state.py)."""

    def __init__(self, setup: RunSetup, checkpoint: dict[str, Any] | None = None) -> None:
        self.setup = setup
        self.progress = Progress()
        self.view = RunView(setup, self.progress)
        self.meters = LoopMeters(
            TrainingStatistics(setup.pipeline, setup.device, setup.distributed)
        )
        self.validation_statistics = statistics_copy(setup.pipeline, setup.device)
        self.session_started = time.perf_counter()
        if checkpoint is not None:
            restore_state(setup, self.progress, self.meters, checkpoint)
            setup.log.info(
                "resumed from episode %d (epoch %d)", self.progress.episode, self.progress.epoch
            )
        elif setup.distributed.rank > 0:
            # Every process built the same initial weights from the seed; from here on each
            # draws its own (dropout), and rank 0 draws what one process alone would.
            seed_everything(setup.seed + setup.distributed.rank)
        # The epoch whose data was trained on last: validation visits that epoch's data, which
        # matters when its sampler changes with the epoch (k-fold's held-out fold rotates).
        self.trained_epoch = max(self.progress.epoch - 1, 0)
        self.histogram_episode = self.progress.episode
        self.check_first_batch = True  # this session's first batch, against every spec
        self.global_batch = 0  # samples in the step's batch over every process

    # ---- the loop --------------------------------------------------------------------------
    def train_epoch(self) -> Status | None:
        setup, progress = self.setup, self.progress
        self.trained_epoch = progress.epoch
        loader = setup.train_data.stoppable(progress.epoch, progress.batch_in_epoch, setup.signals)
        bar = progress_bar(
            setup.train_data.batches_per_epoch(),
            progress.epoch,
            setup.show_progress,
            progress.batch_in_epoch,
        )
        setup.pipeline.train()
        setup.pipeline.start_epoch(progress.epoch)  # the epoch a resumed run continues in, too
        if self.check_first_batch:
            setup.pipeline.check_next_batch("training")
            self.check_first_batch = False
        status = None if progress.step_settled else self.after_step()  # a stop put it off
        for batch in loader if status is None else ():
            batch = to_device(batch, setup.device)
            loss = self.train_step(batch)
            self.record_step(batch, loss, bar)
            status = self.after_step()
            if status is not None:
                break
        status = setup.signals.status if loader.cut_short else status  # workers it ended
        ran_to_end = status is None or (
            not status.requested and progress.batch_in_epoch >= setup.train_data.batches_per_epoch()
        )
        if ran_to_end:
            if progress.batch_in_epoch % setup.accumulation:
                self.optimizer_step()  # the last, shorter accumulation window
            progress.epoch, progress.batch_in_epoch = progress.epoch + 1, 0
        if bar is not None:
            bar.close()
        return self.end_epoch(status)

    def train_step(self, batch: dict[str, Any]) -> torch.Tensor:
        """Forward, loss, divergence check, backward, and the optimizer step when one is due."""
        setup, progress = self.setup, self.progress
        # Compiled models run eagerly for a step a hook observes through forward hooks.
        eager = bool(setup.compiled_models) and setup.hooks.needs_eager_step(self.view)
        if setup.architecture_search is not None:  # DARTS: the architecture's step first
            setup.architecture_search.step(batch, setup.device)
        accumulation, batches = setup.accumulation, setup.train_data.batches_per_epoch()
        ends_window = (progress.batch_in_epoch + 1) % accumulation == 0
        with gradient_sync(setup.pipeline, ends_window or progress.batch_in_epoch + 1 >= batches):
            with running_eagerly(eager), setup.precision.autocast():
                setup.pipeline(batch)
                loss = setup.loss(batch)
            loss, scaled = self.global_loss(batch) if setup.distributed.active else (loss, loss)
            setup.guard.check(loss, batch, progress.episode + 1)
            setup.precision.scaler.scale(
                scaled / accumulation if accumulation > 1 else scaled
            ).backward()
        progress.episode += 1
        progress.batch_in_epoch += 1
        if progress.batch_in_epoch % accumulation == 0:
            self.optimizer_step()
        return loss

    def global_loss(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """With several processes: the global batch's loss and this process's share of its
        gradient (WeightedLoss.across_processes); the global batch's size, for statistics."""
        setup, progress = self.setup, self.progress
        last = progress.batch_in_epoch + 1 == setup.train_data.batches_per_epoch()
        size = setup.train_data.last_batch_size() if last else setup.config.dataloader.batch_size
        self.global_batch = size
        return setup.loss.across_processes(batch, batch_size_of(batch), setup.distributed)

    def optimizer_step(self) -> None:
        setup = self.setup
        scaler, optimizer = setup.precision.scaler, setup.optimizer
        scaler.unscale_(optimizer)  # clipping thresholds are for the true gradients
        clip_gradients(setup.parameters, setup.config.gradient_clipping)
        stepped = setup.precision.step(optimizer)  # fp16: not when the gradients overflowed
        if self.progress.episode - self.histogram_episode >= setup.config.logging_interval:
            setup.reporter.histograms(setup.pipeline, self.progress.episode)  # grads still here
            self.histogram_episode = self.progress.episode
        optimizer.zero_grad(set_to_none=True)
        if setup.scheduler is not None and setup.scheduler_interval == "step" and stepped:
            setup.scheduler.step()  # the schedule counts the optimizer's steps

    # ---- what happens around the step ------------------------------------------------------
    def record_step(self, batch: dict[str, Any], loss: torch.Tensor, bar: Any) -> None:
        setup, progress = self.setup, self.progress
        loss = loss.detach()  # once for both meters
        size = self.global_batch if setup.distributed.active else batch_size_of(batch)
        self.meters.add_step(loss, batch, size)
        if setup.hooks:
            setup.hooks.after_step(self.view, batch, loss)
        if bar is not None:
            bar.update(1)
        if progress.episode % setup.config.logging_interval == 0:
            setup.guard.settle()  # a diverged step's row is not written (the row waits anyway)
            row = self.meters.interval_row(progress, size)
            setup.reporter.row("training_statistics", row, progress.episode)
            if bar is not None:
                bar.set_postfix(
                    loss=f"{row['loss']:.4f}", samples_s=f"{row['samples_per_second']:.0f}"
                )
            setup.hooks.after_interval(self.view)

    def after_step(self) -> Status | None:
        setup, progress = self.setup, self.progress
        if setup.distributed.agree(setup.signals.requested):  # one process alone: no sync
            progress.step_settled = False  # what follows is done when the run resumes
            return setup.signals.status
        progress.step_settled = True
        status = None
        if setup.online and progress.episode % setup.partial_interval == 0:
            status = self.validate(partial=True)
        interval = setup.config.checkpoint_interval
        if interval and progress.episode % interval == 0:
            self.save("last.pt")
        limit = limit_reached(setup.config.terminal_conditions, progress.epoch, progress.episode)
        return status or (limit if limit is Status.EPISODE_LIMIT else None)

    def end_epoch(self, status: Status | None) -> Status | None:
        setup, progress = self.setup, self.progress
        setup.guard.settle()  # the epoch's last step, read before anything uses the weights
        if status is not None and status.requested:  # mid-epoch: running statistics go into
            return status  # last.pt as they are
        row = self.meters.epoch_row(progress, setup.optimizer.param_groups[0]["lr"])
        if setup.architecture_search is not None and setup.distributed.main:
            setup.architecture_search.end_epoch(
                progress.epoch, setup.run_dir, setup.config_text, setup.log
            )
        setup.hooks.after_training_epoch(self.view, row)
        setup.reporter.row("training_epoch_statistics", row, progress.episode)
        setup.log.info(
            "epoch %d (episode %d) training: %s",
            row["epoch"],
            progress.episode,
            format_statistics(row),
        )
        if setup.scheduler is not None and setup.scheduler_interval == "epoch":
            setup.scheduler.step()
        if not setup.online and setup.validation_data is not None:
            status = self.validate(partial=False) or status
        elif not setup.online:
            status = self.judge(self.meters.latest["training"]) or status
        self.save("last.pt")
        limit = limit_reached(setup.config.terminal_conditions, progress.epoch, progress.episode)
        # A stop asked during the validation (a pruner's) ends the run here, not a step into
        # the next epoch; one asked during the last epoch's finds the run ending anyway.
        stop = setup.signals.status if setup.distributed.agree(setup.signals.requested) else None
        return status or limit or stop

    def validate(self, partial: bool, judged: bool = True) -> Status | None:
        """Validation pass; when `judged`, updates best.pt and says whether the run should
        stop (online mode's full pass at the end is not: the partial ones are the monitor's)."""
        setup, progress = self.setup, self.progress
        if setup.validation_data is None:
            return None
        setup.guard.settle()
        setup.pipeline.check_next_batch("validation")
        values = evaluate(
            setup.pipeline,
            setup.validation_data.epoch(self.trained_epoch),
            self.validation_statistics,
            setup.loss,
            setup.precision,
            setup.device,
            max_batches=setup.partial_batches if partial else None,
            observe=self._observer("validation"),
            distributed=setup.distributed,
        )
        setup.hooks.after_eval(self.view, "validation", values, partial)
        kind = "validation_statistics" if partial else "validation_epoch_statistics"
        row = {"epoch": progress.row_epoch, "episode": progress.episode, **values}
        setup.reporter.row(kind, row, progress.episode)
        setup.log.info(
            "epoch %d (episode %d) validation%s: %s",
            row["epoch"],
            progress.episode,
            " (partial)" if partial else "",
            format_statistics(values),
        )
        latest = self.meters.latest
        latest["validation"] = {f"validation.{k}": v for k, v in values.items()}
        if not judged:
            return None
        return self.judge({**latest.get("training", {}), **latest["validation"]})

    def judge(self, statistics: dict[str, float]) -> Status | None:
        setup = self.setup
        if setup.monitor.update(statistics, self.progress.row_epoch):  # as the rows number it
            self.meters.best_statistics = {
                k: v for k, v in statistics.items() if not k.endswith((".epoch", ".episode", ".lr"))
            }
            self.save("best.pt")
        validated = setup.validation_data is not None
        status = judged_end(setup.config.terminal_conditions, statistics, validated, setup.monitor)
        self.progress.judged = status.value if status is not None else ""  # kept in last.pt
        return status

    def _observer(self, section: str) -> Any:
        hooks = self.setup.hooks
        return (lambda batch: hooks.eval_batch(self.view, section, batch)) if hooks else None

    # ---- checkpoints -----------------------------------------------------------------------
    def save(self, name: str) -> None:
        state = checkpoint_state(self.setup, self.progress, self.meters, self.wall_time())
        save_state(self.setup, self.progress, state, name)

    def wall_time(self) -> float:
        """Seconds of training over every session of this run, this one included."""
        return self.progress.wall_time + time.perf_counter() - self.session_started

    # ---- start to end ----------------------------------------------------------------------
    def run(self) -> RunResult:
        """Train, validate and test to the end, and write summary.json however the run ends:
        finished, stopped by a signal, diverged, or failed with an exception (its one-line
        message is the summary's reason). The run folder's lock is released in every case."""
        setup = self.setup
        try:
            result, diverged = self._run()
        except BaseException as raised:
            error = as_user_error(raised, setup.run_dir)
            status = Status.INTERRUPTED if isinstance(error, KeyboardInterrupt) else Status.FAILED
            reason = (
                stopped_at_once_reason(setup.run_dir, setup.signals.by_signal)
                if status is Status.INTERRUPTED
                else failure_reason(error)
            )
            setup.log.error("%s: %s", status.value, reason)
            try:
                self.write_summary(status, reason, None)
            except Exception as secondary:  # a full disk: the first error is what matters
                setup.log.error("summary.json could not be written: %s", secondary)
            if error is not raised:
                raise error from raised
            raise
        finally:
            self.close()
        if diverged is not None:
            raise diverged  # after the summary says so: the CLI exits 2 with its message
        return result

    def close(self) -> None:
        """Close the run's files and release its folder (run() does it; a loop that was set
        up and is not run must be closed)."""
        self.setup.hooks.release()
        self.setup.train_data.close()  # a reservoir's workers
        self.setup.reporter.close()
        close_logger(self.setup.log)
        self.setup.lock.release()

    def _run(self) -> tuple[RunResult, Diverged | None]:
        setup = self.setup
        # Signals stop the run gracefully from here to the end, final test pass included; one
        # before the first step (opening the reporters takes a moment) saves last.pt at once.
        with setup.signals:
            opening = (setup.name, setup.device, setup.seed, setup.run_dir)
            setup.log.info("training '%s' on %s, seed %d, run folder %s", *opening)
            batches = setup.train_data.batches_per_epoch()
            if note := limit_inside_a_window(
                setup.config.terminal_conditions, batches, setup.accumulation
            ):
                setup.log.warning("%s", note)
            if setup.distributed.main:
                write_running(setup.run_dir, setup.name)
            setup.reporter.open()
            for component in setup.pipeline.components.values():
                if setup.distributed.main:  # viewers write into the run folder
                    component.begin_pass("training", setup.run_dir)
            # Before the hooks' start, which the analysis time counts (a model summary's pass).
            started = time.perf_counter()
            setup.hooks.before_train(self.view)
            conditions = setup.config.terminal_conditions
            status = resumed_end(conditions, self.progress, setup.monitor)
            if status is None and setup.distributed.agree(setup.signals.requested):
                status = setup.signals.status
            diverged: Diverged | None = None
            try:
                while status is None:
                    status = self.train_epoch()
            except Diverged as error:
                status, diverged = Status.DIVERGED, error
            reason = diverged.format() if diverged is not None else status.reason
            if status.requested:
                self.save("last.pt")
                if status is Status.STOPPED:  # by a hook, for its reason: no --resume to offer
                    reason = str(setup.signals.reason)
                    setup.log.info("stopped: %s; last.pt saved", reason)
                else:  # a run another command started (a QAT fine-tuning) is continued by it
                    started_by = read_started_by(setup.run_dir) or {}
                    command = started_by.get("command") or f"loom train --resume {setup.run_dir}"
                    setup.log.info("interrupted: last.pt saved; continue with `%s`", command)
            elif status is not Status.DIVERGED and setup.online and setup.validation_data:
                self.validate(partial=False, judged=False)
            for component in setup.pipeline.components.values():
                component.end_pass()
            training_seconds = time.perf_counter() - started
            setup.hooks.training_ended()
            test = None
            if setup.test_data is not None and status.finished and status is not Status.DIVERGED:
                try:
                    test = run_test_pass(setup, self.progress, self.view, self._observer("test"))
                except PassInterrupted:
                    status = Status.INTERRUPTED
                    reason = "stopped by a signal during the final test pass; --resume runs it"
                    setup.log.info("interrupted during the test pass: %s", reason)
            result = self.write_summary(status, reason, test)
            setup.hooks.after_train(self.view, result.summary)
        if setup.hooks:
            setup.log.info("%s", setup.hooks.cost(training_seconds))
        if diverged is not None:
            kept = (setup.run_dir / "checkpoints" / "best.pt").exists()
            setup.log.error("%s%s", diverged.format(), "; best.pt is intact" if kept else "")
        return result, diverged

    def write_summary(
        self, status: Status, reason: str, test: dict[str, float] | None
    ) -> RunResult:
        setup = self.setup
        summary = run_summary(
            setup, self.progress, self.meters, status, reason, test, self.wall_time()
        )
        if not setup.distributed.main:
            return RunResult(setup.run_dir, summary)
        return write_summary(setup.run_dir, summary)
