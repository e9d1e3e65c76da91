"""The training loop on toy components, in this process, each in about a second: the
optimizer steps of gradient accumulation (the leftover one at an epoch's end), divergence,
patience and early stopping, mid-epoch resume, online validation, and schedulers stepped per
step and per epoch."""

from __future__ import annotations

import csv
import functools
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from torchloom.api import Hook, RunView
from torchloom.engine.checkpoint import (
    capture_rng_state,
    load_checkpoint,
    restore_rng_state,
    set_deterministic,
)
from torchloom.engine.setup import prepare_training
from torchloom.engine.state import StopSignals, TrainOptions
from torchloom.engine.step import Diverged
from torchloom.errors import ConfigError
from toy_runs import StopAt, model_weights, only_run, summary, toy_config, train, write

# toy_config: 40 training samples in batches of 8, i.e. 5 batches an epoch.


def column(run: Path, file: str, name: str) -> list[float]:
    with open(run / file, newline="") as handle:
        return [float(row[name]) for row in csv.DictReader(handle)]


def test_accumulation_steps_every_n_batches_and_once_more_at_an_epochs_end(
    tmp_path: Path,
) -> None:
    config = toy_config(epochs=1, gradient_accumulation=2, optimizer={"type": "Adam", "lr": 0.01})
    result = train(config, tmp_path)
    state = load_checkpoint(result.run_dir / "checkpoints" / "last.pt")["optimizer"]["state"]
    # batches 1+2, 3+4, then the leftover window of batch 5: three optimizer steps
    assert {int(s["step"]) for s in state.values()} == {3}


def test_a_run_stopped_at_its_episode_limit_inside_a_window_says_so(tmp_path: Path) -> None:
    """5 batches an epoch, windows of 4: a limit of 6 stops one batch into a window, which is
    not stepped (last.pt keeps its gradients, for a resume with a higher limit); the log says
    so when the run starts."""
    config = toy_config(epochs=None, gradient_accumulation=4)
    config["training"]["terminal_conditions"] = {"episode_limit": 6}
    result = train(config, tmp_path)
    log = (result.run_dir / "run.log").read_text(encoding="utf-8")
    assert "episode_limit 6 ends the run 1 batch(es) into a gradient_accumulation window" in log
    assert load_checkpoint(result.run_dir / "checkpoints" / "last.pt")["running"]["gradients"]
    config["training"]["terminal_conditions"] = {"episode_limit": 9}  # 5 + 4: a window's end
    assert "ends the run" not in (train(config, tmp_path / "9").run_dir / "run.log").read_text()


def test_a_loss_that_turns_nan_stops_the_run_within_the_step(tmp_path: Path) -> None:
    config = toy_config(epochs=3)
    config["pipeline"]["noise"] = {"type": "trust_components:NanAtStep", "at": 8}
    config["pipeline"]["model"]["streams"] = {"inputs": "noisy"}
    with pytest.raises(Diverged, match="episode 8: loss 'loss' = nan is not finite"):
        train(config, tmp_path)
    run = only_run(tmp_path)
    ended = summary(run)
    assert ended["status"] == "diverged" and ended["episodes"] == 7
    # best.pt is epoch 1's (the run ended in epoch 2), and stays as it was
    assert load_checkpoint(run / "checkpoints" / "best.pt")["progress"]["epoch"] == 1


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("at", [4, 5], ids=["before a checkpoint", "the run's last step"])
def test_a_deferred_check_reads_the_pending_step_before_the_weights_are_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: int, device: str
) -> None:
    """On a GPU the guard reads a step's flag at the next step (deferred; on the CPU made so
    here), after that step's backward pass and optimizer step: a loss that turns NaN at the
    step before a checkpoint (checkpoint_interval 4) or at the run's last step still ends the
    run as diverged, naming that step, and no checkpoint, validation or test pass sees the
    weights it made."""
    import torchloom.engine.setup as setup_module

    if device == "cpu":
        deferred = functools.partial(setup_module.DivergenceGuard, deferred=True)
        monkeypatch.setattr(setup_module, "DivergenceGuard", deferred)
    config = toy_config(epochs=1, checkpoint_interval=4)
    config["pipeline"]["noise"] = {"type": "trust_components:NanAtStep", "at": at}
    config["pipeline"]["model"]["streams"] = {"inputs": "noisy"}
    with pytest.raises(Diverged, match=f"episode {at}: loss 'loss' = nan is not finite"):
        train(config, tmp_path, device=device)
    run = only_run(tmp_path)
    assert summary(run)["status"] == "diverged"
    assert not (run / "validation_epoch_statistics.csv").exists()
    for saved in (run / "checkpoints").glob("*.pt"):
        weights = model_weights(run, saved.name).values()
        assert all(bool(torch.isfinite(w).all()) for w in weights), saved.name
    # Episode 4 is a logging step: its row is not written either, as on the CPU's immediate
    # check (the row reads the step's values, so settling first costs no extra wait).
    with open(run / "training_statistics.csv", newline="") as handle:
        logged = [int(row["episode"]) for row in csv.DictReader(handle)]
    assert logged == [2] if at == 4 else logged == [2, 4]


def test_patience_runs_out_and_the_run_stops_early(tmp_path: Path) -> None:
    # validation.seen is the same every epoch (16 samples): it never improves after epoch 1
    stopping = {"monitor": "validation.seen", "mode": "max", "patience": 1}
    config = toy_config(
        epochs=10, terminal_conditions={"epoch_limit": 10, "early_stopping": stopping}
    )
    result = train(config, tmp_path)
    # epoch 1 is the best; epochs 2 and 3 are not better, and 2 > patience 1
    assert result.status == "early_stopped" and result.summary["epochs"] == 3
    assert result.summary["monitor"]["best_epoch"] == 1


def test_a_run_stopped_mid_epoch_resumes_bit_identical(tmp_path: Path) -> None:
    reference = train(toy_config(), tmp_path / "reference")
    stopped = train(toy_config(), tmp_path / "runs", StopAt(3))
    assert stopped.status == "interrupted"
    progress = load_checkpoint(stopped.run_dir / "checkpoints" / "last.pt")["progress"]
    assert (progress["epoch"], progress["batch_in_epoch"]) == (0, 3)
    resumed = train(None, tmp_path / "runs", resume=stopped.run_dir)
    for key, tensor in model_weights(reference.run_dir).items():
        assert torch.equal(tensor, model_weights(resumed.run_dir)[key]), key
    assert column(resumed.run_dir, "training_statistics.csv", "loss") == column(
        reference.run_dir, "training_statistics.csv", "loss"
    )


def _online_config() -> dict[str, Any]:
    config: dict[str, Any] = toy_config(epochs=2, mode="online")
    config["validation"].update(partial_validation_interval=2, partial_validation_batches=1)
    return config


def _limit_config() -> dict[str, Any]:
    config = toy_config(epochs=None)  # 5 batches an epoch: the limit falls 2 into the second
    config["training"]["terminal_conditions"] = {"episode_limit": 7}
    return config


@pytest.mark.parametrize(
    ("config", "stop_at"),
    [(_online_config, 4), (_limit_config, 7)],
    ids=["partial-validation-due", "episode-limit-step"],
)
def test_a_stop_between_a_step_and_its_due_work_resumes_to_the_same_run(
    tmp_path: Path, config: Any, stop_at: int
) -> None:
    """A stop signal during a step skipped the work due after it (a partial validation, the
    episode limit's end of epoch), and last.pt counted the step as done: the resumed run
    never did that work (its validations at 2, 6, 8; the limit's epoch row, validation and
    best.pt missing)."""
    reference = train(config(), tmp_path / "reference")
    stopped = train(config(), tmp_path / "runs", StopAt(stop_at))
    assert stopped.status == "interrupted"
    resumed = train(None, tmp_path / "runs", resume=stopped.run_dir)
    assert resumed.status == reference.status
    for name in ("validation_statistics.csv", "validation_epoch_statistics.csv"):
        if (reference.run_dir / name).exists():
            for key in ("episode", "loss"):
                assert column(resumed.run_dir, name, key) == column(reference.run_dir, name, key)
    assert column(resumed.run_dir, "training_epoch_statistics.csv", "epoch") == column(
        reference.run_dir, "training_epoch_statistics.csv", "epoch"
    )
    for checkpoint in ("last.pt", "best.pt"):
        want, got = (
            model_weights(reference.run_dir, checkpoint),
            model_weights(resumed.run_dir, checkpoint),
        )
        assert all(torch.equal(tensor, got[key]) for key, tensor in want.items()), checkpoint
    assert summary(resumed.run_dir)["final"]["test"] == summary(reference.run_dir)["final"]["test"]


def test_a_run_resumed_at_an_epoch_s_end_does_not_warn_of_a_schedule_step_order(
    tmp_path: Path,
) -> None:
    """torch's flag that the optimizer stepped is not in its state: the resumed epoch-end
    schedule step printed "lr_scheduler.step() before optimizer.step()" (wrongly)."""
    import warnings

    scheduler = {"type": "StepLR", "step_size": 1, "gamma": 0.5}
    stopped = train(toy_config(scheduler=scheduler), tmp_path, StopAt(5))  # the epoch's last
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(None, tmp_path, resume=stopped.run_dir)
    assert not [w for w in caught if "lr_scheduler.step()" in str(w.message)]


class StopInTestPass(Hook):
    """Asks the run to stop as a signal does, at the first batch of its final test pass."""

    name = "stop_in_test_pass"

    def eval_batch(self, run: RunView, section: str, batch: Any) -> None:
        if section == "test":
            run.request_stop()


@pytest.mark.parametrize(
    "conditions",
    [
        {"epoch_limit": 3, "early_stopping": {"monitor": "validation.seen", "patience": 0}},
        {"epoch_limit": 3, "loss_stop_threshold": 100.0},
    ],
    ids=["early-stopped", "converged"],
)
def test_a_run_stopped_in_the_test_pass_its_judge_began_resumes_to_that_end(
    tmp_path: Path, conditions: dict[str, Any]
) -> None:
    """The resumed run looked at the limits alone: it trained the epochs early stopping (or
    convergence) had ended, then tested other weights (episode 15 against 10)."""
    config = toy_config(epochs=3, terminal_conditions=conditions)
    config["test"]["dataloader"] = {"batch_size": 4}  # a pass of 4 batches, stopped in the first
    reference = train(config, tmp_path / "reference")
    assert reference.status in ("early_stopped", "converged")
    stopped = train(config, tmp_path / "runs", StopInTestPass())
    assert stopped.status == "interrupted"
    resumed = train(None, tmp_path / "runs", resume=stopped.run_dir)
    assert resumed.status == reference.status
    ended, expected = summary(resumed.run_dir), summary(reference.run_dir)
    assert (ended["epochs"], ended["episodes"]) == (expected["epochs"], expected["episodes"])
    assert ended["final"]["test"] == expected["final"]["test"]
    for key, tensor in model_weights(reference.run_dir).items():
        assert torch.equal(tensor, model_weights(resumed.run_dir)[key]), key


def test_an_fp16_run_stopped_before_its_short_last_window_s_step_resumes(tmp_path: Path) -> None:
    """5 batches an epoch in windows of 2: a stop on the 5th left the leftover window's step
    to the resumed run, whose scaler had no scale yet (torch's `unscale_` asserted), and
    every resume failed the same way."""
    config = toy_config(gradient_accumulation=2, precision="fp16")
    reference = train(config, tmp_path / "reference")
    stopped = train(config, tmp_path / "runs", StopAt(5))
    resumed = train(None, tmp_path / "runs", resume=stopped.run_dir)
    assert resumed.status == reference.status == "epoch_limit"
    for key, tensor in model_weights(reference.run_dir).items():
        assert torch.equal(tensor, model_weights(resumed.run_dir)[key]), key


class StopAfterValidation(Hook):
    """Asks the run to stop, with a reason, after the validation of epoch `epoch` (as a
    search's pruner does)."""

    name = "stop_after_validation"

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def after_eval(self, run: RunView, section: str, values: dict[str, Any], partial: bool) -> None:
        if section == "validation" and run.progress.epoch == self.epoch:
            run.request_stop(f"judged at epoch {self.epoch}")


def test_a_hook_stops_a_run_at_the_epoch_it_judged_with_its_reason(tmp_path: Path) -> None:
    stopped = train(toy_config(epochs=3), tmp_path / "a", StopAfterValidation(1))
    ended = summary(stopped.run_dir)
    assert (ended["status"], ended["reason"]) == ("stopped", "judged at epoch 1")
    assert (ended["epochs"], ended["episodes"]) == (1, 5)  # not a step into epoch 2
    assert "test" not in ended["final"]  # stopped early: no test pass
    assert "--resume" not in (stopped.run_dir / "run.log").read_text()
    # Asked during the last epoch's validation, the stop finds the run at its limit: the run
    # ends as it would have, its test pass included (a signal then would stop that pass).
    last = train(toy_config(epochs=3), tmp_path / "b", StopAfterValidation(3))
    ended = summary(last.run_dir)
    assert ended["status"] == "epoch_limit" and "test" in ended["final"]


class SlowStart(Hook):
    name = "slow_start"

    def before_train(self, run: RunView) -> None:
        import time

        time.sleep(0.3)


def test_the_analysis_cost_counts_its_start_in_the_training_time(tmp_path: Path) -> None:
    """The hooks' time before the first step (a model summary's pass) was counted as
    analysis but not in the training time it is a share of: "analysis took 0.1 s of the
    0.0 s of training (320.3%)"."""
    import re

    run = train(toy_config(epochs=1), tmp_path, SlowStart()).run_dir
    found = re.search(
        r"took ([\d.]+) s of the ([\d.]+) s of training \(([\d.]+)%", (run / "run.log").read_text()
    )
    assert found is not None
    during, training, share = (float(v) for v in found.groups())
    assert during >= 0.3 and training >= during and share <= 100


def test_a_ctrl_c_as_the_run_opens_its_reporters_saves_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening the reporters (TensorBoard's import) took a moment before the run's graceful
    stop began: a Ctrl-C then ended it with no last.pt ("not a run folder with checkpoints")
    and a summary saying a second signal had come. Now it saves last.pt before the first
    step, and the resumed run trains what a run left alone trains."""
    from torchloom.engine.reporting import Reporter

    reference = train(toy_config(epochs=1), tmp_path / "reference")
    opened = Reporter.open

    def open_then_ctrl_c(self: Reporter) -> None:
        opened(self)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(Reporter, "open", open_then_ctrl_c)
    stopped = train(toy_config(epochs=1), tmp_path / "runs")
    monkeypatch.setattr(Reporter, "open", opened)
    assert stopped.status == "interrupted" and stopped.summary["episodes"] == 0
    assert "second signal" not in stopped.summary["reason"]
    resumed = train(None, tmp_path / "runs", resume=stopped.run_dir)
    assert resumed.status == "epoch_limit"
    for key, tensor in model_weights(reference.run_dir).items():
        assert torch.equal(tensor, model_weights(resumed.run_dir)[key]), key


class InterruptedAtStart(Hook):
    """A KeyboardInterrupt as the run begins, with no signal to the run's own handler (the
    command's first Ctrl-C, an instant before the run's graceful stop begins)."""

    name = "interrupted_at_start"

    def before_train(self, run: RunView) -> None:
        raise KeyboardInterrupt


def test_a_run_stopped_at_once_before_its_first_save_says_start_it_again(
    tmp_path: Path,
) -> None:
    with pytest.raises(KeyboardInterrupt):
        train(toy_config(epochs=1), tmp_path, InterruptedAtStart())
    ended = summary(only_run(tmp_path))
    assert ended["status"] == "interrupted"
    assert ended["reason"].endswith("before its first save: start the run again")
    assert "second signal" not in ended["reason"]


def test_a_ctrl_c_after_a_hooks_stop_is_a_first_ctrl_c() -> None:
    """A hook's stop (a pruner's) is not a signal: the user's first Ctrl-C after it still
    stops the run gracefully (last.pt saved); only a second one stops it at once."""
    with StopSignals() as signals:
        signals.stop("pruned by the search at step 1")
        os.kill(os.getpid(), signal.SIGINT)  # handled at once, in this (the main) thread
        assert signals.by_signal and signals.status.value == "interrupted"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)


def test_a_loader_failing_while_a_signal_stop_is_pending_is_an_interruption(
    tmp_path: Path,
) -> None:
    """A SIGTERM to the whole process group (Slurm's scancel) may kill the loader's workers
    too: the run was asked to stop, so it ends `interrupted` with last.pt of its last
    finished step, not `failed`."""
    config = toy_config(epochs=3)
    config["training"]["task"] = {"type": "trust_components:TerminatedLoader", "size": 40}
    result = train(write(tmp_path, config), tmp_path / "runs")
    stopped = summary(result.run_dir)
    assert stopped["status"] == "interrupted", stopped["reason"]
    assert stopped["episodes"] == 2  # the third batch never came
    saved = load_checkpoint(result.run_dir / "checkpoints" / "last.pt")["progress"]
    assert (saved["epoch"], saved["episode"], saved["batch_in_epoch"]) == (0, 2, 2)


class TerminateSoon(Hook):
    """Sends this process SIGTERM `after` seconds into the training (the reservoir's fill)."""

    name = "terminate_soon"

    def __init__(self, after: float) -> None:
        self.after = after

    def before_train(self, run: RunView) -> None:
        self.started = time.monotonic()
        threading.Timer(self.after, os.kill, (os.getpid(), signal.SIGTERM)).start()


def test_a_stop_signal_during_the_reservoirs_fill_stops_the_run_at_once(tmp_path: Path) -> None:
    """The first batch waits for the reservoir to fill (here 16 samples of 0.5 s with two
    workers: 4 s); a stop signal during it waited for the whole fill."""
    config = toy_config(
        epochs=1,
        dataloader={"batch_size": 8, "reservoir": {"size": 16, "workers": 2}},
    )
    config["training"]["task"] = {"type": "trust_components:SlowSamples", "size": 40}
    hook = TerminateSoon(0.3)
    result = train(write(tmp_path, config), tmp_path / "runs", hook)
    assert time.monotonic() - hook.started < 2.0
    stopped = summary(result.run_dir)
    assert stopped["status"] == "interrupted" and stopped["episodes"] == 0
    assert (result.run_dir / "checkpoints" / "last.pt").is_file()


def test_a_finished_run_leaves_no_logger_behind(tmp_path: Path) -> None:
    # Many runs in one process (a search's trials): `logging` would keep each run's logger.
    result = train(toy_config(epochs=1), tmp_path)
    kept = [name for name in logging.Logger.manager.loggerDict if str(result.run_dir) in name]
    assert kept == []


def test_online_mode_validates_part_of_the_set_every_n_episodes(tmp_path: Path) -> None:
    config: dict[str, Any] = toy_config(epochs=1, mode="online")
    config["validation"].update(
        partial_validation_interval=2,
        partial_validation_batches=1,
        dataloader={"batch_size": 4},
    )
    result = train(config, tmp_path)
    assert column(result.run_dir, "validation_statistics.csv", "episode") == [2, 4]
    assert column(result.run_dir, "validation_statistics.csv", "samples") == [4, 4]
    # and one full pass when training ends
    assert column(result.run_dir, "validation_epoch_statistics.csv", "samples") == [16]


def test_rows_of_an_epoch_cut_short_by_the_episode_limit_are_numbered_as_its_own(
    tmp_path: Path,
) -> None:
    """5 batches an epoch, a limit of 7: the second epoch stops two batches in. Its training
    row said epoch 1 (the epochs completed), its validation row epoch 2, the test row epoch 1
    and the monitor's best epoch 1 for the second validation."""
    config = toy_config(epochs=None)
    config["training"]["terminal_conditions"] = {"episode_limit": 7}
    config["training"]["terminal_conditions"]["early_stopping"] = {
        "monitor": "validation.samples",  # 16 each time: the first is the best
        "mode": "max",
    }
    result = train(config, tmp_path)
    run = result.run_dir
    assert column(run, "training_epoch_statistics.csv", "epoch") == [1, 2]
    assert column(run, "validation_epoch_statistics.csv", "epoch") == [1, 2]
    assert column(run, "test_statistics.csv", "epoch") == [2]
    assert column(run, "training_statistics.csv", "epoch") == [1, 1, 2]  # episodes 2, 4, 6
    assert summary(run)["monitor"]["best_epoch"] == 1


@pytest.mark.parametrize(
    ("monitor", "reported"),
    [
        ("training.samples", False),  # training rows have none: the run failed after epoch 1
        ("validation.loss_std", True),  # reported, and refused before
        ("training.loss_max", True),
        ("training.lr", True),
    ],
)
def test_a_monitor_is_checked_against_the_columns_the_rows_have(
    tmp_path: Path, monitor: str, reported: bool
) -> None:
    config = toy_config(epochs=1)
    config["training"]["terminal_conditions"]["early_stopping"] = {"monitor": monitor}
    if not reported:
        with pytest.raises(ConfigError, match="is not a statistic of this pipeline"):
            train(config, tmp_path)
        assert not list(tmp_path.glob("*/*"))
        return
    result = train(config, tmp_path)
    assert summary(result.run_dir)["monitor"]["name"] == monitor
    assert summary(result.run_dir)["monitor"]["best"] is not None


class StepLosses(Hook):
    name = "step_losses"

    def __init__(self) -> None:
        self.steps: list[tuple[float, int]] = []

    def after_step(self, run: RunView, batch: Any, loss: torch.Tensor) -> None:
        self.steps.append((float(loss), len(batch["targets"])))


def test_a_training_epoch_row_s_loss_is_the_mean_over_its_samples(tmp_path: Path) -> None:
    """40 samples in batches of 16: the last batch of 8 counted as much as a full one."""
    recorded = StepLosses()
    config = toy_config(epochs=1, dataloader={"batch_size": 16})
    result = train(config, tmp_path, recorded)
    assert [size for _, size in recorded.steps] == [16, 16, 8]
    expected = sum(loss * size for loss, size in recorded.steps) / 40
    (row,) = column(result.run_dir, "training_epoch_statistics.csv", "loss")
    assert row == pytest.approx(expected, rel=1e-5)
    assert row != pytest.approx(sum(loss for loss, _ in recorded.steps) / 3, rel=1e-5)


def test_online_mode_without_a_validation_section_is_a_config_error(tmp_path: Path) -> None:
    """It failed at the first step with an AssertionError (exit 1), its run folder made."""
    config = toy_config(mode="online")
    del config["validation"]
    with pytest.raises(ConfigError, match="has no validation section") as refused:
        train(config, tmp_path)
    assert "training.mode" in refused.value.format()
    assert not list(tmp_path.glob("*/*"))


def test_online_best_epoch_is_the_epoch_its_partial_validation_row_names(tmp_path: Path) -> None:
    config: dict[str, Any] = toy_config(epochs=1, mode="online")
    config["validation"].update(partial_validation_interval=2, partial_validation_batches=1)
    config["training"]["terminal_conditions"]["early_stopping"] = {
        "monitor": "validation.samples",
        "mode": "max",
    }
    result = train(config, tmp_path)
    assert column(result.run_dir, "validation_statistics.csv", "epoch") == [1, 1]
    assert summary(result.run_dir)["monitor"]["best_epoch"] == 1


def test_online_mode_s_final_full_validation_does_not_compete_with_the_partial_ones(
    tmp_path: Path,
) -> None:
    """The monitor, best.pt and early stopping follow the partial validations (user guide):
    the full pass at the end measured more samples, which as the monitor made it the best
    and rewrote best.pt with the final weights."""
    config: dict[str, Any] = toy_config(epochs=1, mode="online")
    config["validation"].update(partial_validation_interval=2, partial_validation_batches=1)
    config["validation"]["dataloader"] = {"batch_size": 4}
    config["training"]["terminal_conditions"]["early_stopping"] = {
        "monitor": "validation.samples",  # 4 per partial pass, 16 in the full one
        "mode": "max",
    }
    result = train(config, tmp_path)
    run = result.run_dir
    assert column(run, "validation_epoch_statistics.csv", "samples") == [16]
    ended = summary(run)
    assert ended["monitor"]["best"] == 4 and ended["best"]["validation.samples"] == 4
    assert load_checkpoint(run / "checkpoints" / "best.pt")["progress"]["episode"] == 2
    assert ended["final"]["validation"]["samples"] == 16  # still reported


# An epoch row's rate is read after the epoch's last step: per step, the rate the next step
# will use; per epoch, the rate the epoch used (its scheduler step follows the row).
@pytest.mark.parametrize(
    ("interval", "epoch_rates"),
    [("step", [0.1 * 0.5**5, 0.1 * 0.5**10]), ("epoch", [0.1, 0.05])],
)
def test_a_scheduler_steps_per_step_or_per_epoch(
    tmp_path: Path, interval: str, epoch_rates: list[float]
) -> None:
    scheduler = {"type": "StepLR", "step_size": 1, "gamma": 0.5, "interval": interval}
    result = train(toy_config(scheduler=scheduler), tmp_path)
    assert column(result.run_dir, "training_epoch_statistics.csv", "lr") == pytest.approx(
        epoch_rates
    )


class EventFilesAtEachStep(Hook):
    name = "event_files"

    def __init__(self) -> None:
        self.counts: list[int] = []

    def after_step(self, run: RunView, batch: Any, loss: torch.Tensor) -> None:
        self.counts.append(len(list((run.run_dir / "tensorboard").glob("events.*"))))


def test_the_tensorboard_writer_is_open_before_the_first_step(tmp_path: Path) -> None:
    """Opening it imports tensorboard (tenths of a second): done before the loop, no step pays
    for it, where it fell on the step that logged the first row (inside a throughput
    benchmark's counted steps)."""
    spy = EventFilesAtEachStep()
    options = TrainOptions(expdir=str(tmp_path), quiet=True, tensorboard=1, hooks=[spy])
    prepared = prepare_training(write(tmp_path, toy_config(epochs=1)), (), options)
    prepared.run()  # type: ignore[union-attr]  # a fresh run
    assert spy.counts == [1] * 5  # 5 batches: the events file exists from the first on


def test_deterministic_mode_sets_the_cublas_workspace_a_gpu_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`training.deterministic` on a GPU: torch refuses a deterministic matrix product on CUDA
    unless CUBLAS_WORKSPACE_CONFIG is one of cuBLAS's two reproducible settings. Set-up sets
    one when the environment has none, keeps a valid one, and names a wrong one on a machine
    with CUDA instead of failing at the first step."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # so that the test's end restores it
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    try:
        set_deterministic(True)
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
        set_deterministic(True)
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
        set_deterministic(True)  # no GPU: nothing reads it
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        with pytest.raises(ConfigError, match="the environment sets it to ':0:0'") as error:
            set_deterministic(True)
        assert "training.deterministic" in str(error.value)
    finally:
        set_deterministic(False)


def test_a_run_without_deterministic_algorithms_does_not_import_the_compiler() -> None:
    """torch.use_deterministic_algorithms imports torch._inductor (for its own flag), 2 s of a
    7 s toy run on two cores: a run that leaves them off, as torch has them, skips the call;
    turned on, then off again in the same process, both flags follow."""
    script = """
import sys, torch
from torchloom.engine.checkpoint import set_deterministic
set_deterministic(False)
assert "torch._inductor" not in sys.modules, "imported the compiler"
set_deterministic(True)
import torch._inductor.config as inductor
assert torch.are_deterministic_algorithms_enabled() and inductor.deterministic
set_deterministic(False)
assert not torch.are_deterministic_algorithms_enabled() and not inductor.deterministic
assert not torch.backends.cudnn.deterministic and torch.backends.cudnn.benchmark
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_run_saved_with_more_gpus_restores_the_generators_of_those_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """last.pt keeps every GPU's generator; resumed on a machine with fewer GPUs, those it
    has get theirs (torch's set_rng_state_all would fail on the first GPU missing)."""
    state = capture_rng_state()
    state["cuda"] = [torch.full((16,), gpu, dtype=torch.uint8) for gpu in range(4)]
    restored: list[tuple[int, int]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)

    def set_rng_state(new_state: torch.Tensor, device: int) -> None:
        if device >= 2:
            raise RuntimeError(f"CUDA error: invalid device ordinal {device}")
        restored.append((device, int(new_state[0])))

    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    restore_rng_state(state)
    assert restored == [(0, 0), (1, 1)]


def test_a_run_resumed_on_another_gpu_continues_its_own_gpu_s_generator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run on `cuda:1` resumed on a one-GPU machine (or with `--device cuda:0`): its GPU's
    generator (dropout, draws on the GPU) went to GPU 1's slot, missing here, and the run's
    GPU began its stream again, in silence. The run's GPU is now recorded and continued."""
    saved_states = [torch.full((16,), gpu + 10, dtype=torch.uint8) for gpu in range(2)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: saved_states)
    state = capture_rng_state(torch.device("cuda:1"))
    assert state["cuda_device"] == 1
    restored: list[tuple[int, int]] = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(
        torch.cuda, "set_rng_state", lambda new, gpu: restored.append((gpu, int(new[0])))
    )
    restore_rng_state(state, torch.device("cuda:0"))
    assert restored[-1] == (0, 11)  # GPU 0 continues where the run's GPU 1 was


def test_a_cpu_run_on_a_gpu_machine_saves_without_starting_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reading the GPUs' generators starts CUDA in the process: a `--device cpu` run on a GPU
    machine took GPU memory at its first checkpoint, and failed there on a busy GPU."""

    def starts_cuda() -> list[torch.Tensor]:
        raise RuntimeError("CUDA-capable device(s) is/are busy or unavailable")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", starts_cuda)
    assert "cuda" not in capture_rng_state(torch.device("cpu"))


def test_a_set_up_that_fails_after_the_run_log_opened_closes_what_it_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's log also writes for the shared data and viewer loggers: a set-up that failed
    after opening it (here torch.compile of the models) left it there, so a later run of the
    same process (a search's next trial) wrote into the failed one's run.log, and the folder
    stayed locked while the process lived."""
    import torchloom.engine.setup as setup_module
    from torchloom.engine.reporting import COMPONENT_LOGGERS
    from torchloom.engine.run_lock import RunLock

    def failing(*args: Any) -> list[str]:
        raise RuntimeError("compilation failed")

    monkeypatch.setattr(setup_module, "compile_models", failing)
    before = {name: list(logging.getLogger(name).handlers) for name in COMPONENT_LOGGERS}
    with pytest.raises(RuntimeError, match="compilation failed"):
        train(toy_config(epochs=1, compile=True), tmp_path, device="cpu")
    run = only_run(tmp_path)
    assert (run / "run.log").exists()
    for name in COMPONENT_LOGGERS:
        assert logging.getLogger(name).handlers == before[name], name
    assert not [n for n in logging.Logger.manager.loggerDict if n.startswith("torchloom.run.")]
    RunLock(run).acquire().release()  # free again


def test_histograms_of_an_overflowed_fp16_step_draw_the_finite_values(tmp_path: Path) -> None:
    """A GradScaler skips an fp16 step whose gradients overflowed, and leaves them inf or NaN
    until they are cleared: TensorBoard cannot bin those ("The histogram is empty"), which
    ended a `--tensorboard 2` run as failed when such a step fell on a histogram step."""
    from types import SimpleNamespace

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from torchloom.engine.reporting import Reporter

    overflowed, partly = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    for parameter in overflowed.parameters():
        parameter.grad = torch.full_like(parameter, float("inf"))
    for parameter in partly.parameters():
        parameter.grad = torch.ones_like(parameter)
    assert partly.weight.grad is not None
    partly.weight.grad[0, 0] = float("nan")
    reporter = Reporter(tmp_path, logging.getLogger("test.histograms"), tensorboard=2)
    reporter.histograms(SimpleNamespace(components={"a": overflowed, "b": partly}), 10)
    reporter.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"histograms": 0})
    events.Reload()
    tags = set(events.Tags()["histograms"])
    assert {"weights/a/weight", "weights/a/bias", "weights/b/weight"} <= tags
    assert not any(tag.startswith("gradients/a/") for tag in tags)  # nothing finite to draw
    drawn = events.Histograms("gradients/b/weight")[0].histogram_value
    assert (drawn.num, drawn.min, drawn.max) == (5, 1.0, 1.0)


def test_full_float32_turns_tf32_off_through_the_older_torch_flags_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch before 2.9 has no `fp32_precision` settings: there the legacy `allow_tf32`
    flags are turned off within, and back as they were after, an exception included."""
    from torchloom.engine.step import full_float32

    matmul_before = torch.backends.cuda.matmul.fp32_precision
    monkeypatch.delattr(type(torch.backends.cudnn), "conv")  # as torch 2.8 and before
    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    with pytest.raises(RuntimeError, match="in the step"), full_float32():
        assert not torch.backends.cudnn.allow_tf32
        assert not torch.backends.cuda.matmul.allow_tf32
        raise RuntimeError("in the step")
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == before
    monkeypatch.undo()
    torch.backends.cuda.matmul.fp32_precision = matmul_before  # the legacy flag set 'ieee'


@pytest.mark.parametrize("fused", [False, True])
def test_a_step_the_fp16_scaler_skips_does_not_advance_a_per_step_schedule(fused: bool) -> None:
    """An fp16 step whose gradients overflowed is skipped by the scaler; the per-step
    scheduler stepped anyway, so the schedule ran ahead of the optimizer (torch warned at a
    run's first, usually overflowed, step: "lr_scheduler.step() before optimizer.step()").
    `Precision.step` says whether the step was taken, and the loop steps the schedule only
    then. A fused optimizer is always stepped by the scaler and skips the update inside its
    kernel: its post-step hook ran on overflowed steps too, so they counted as taken."""
    import warnings

    from torchloom.engine.step import Precision

    precision = Precision("fp16", torch.device("cpu"))
    layer = torch.nn.Linear(2, 1)
    if fused:
        optimizer: torch.optim.Optimizer = torch.optim.Adam(layer.parameters(), lr=0.1, fused=True)
    else:
        optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    before = [p.detach().clone() for p in layer.parameters()]
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    taken, rates = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's warning of a schedule ahead of its optimizer
        for factor in (1e38, 1.0, 1.0):  # the first overflows at the scaler's 65536
            precision.scaler.scale(layer(torch.ones(3, 2)).sum() * factor).backward()
            precision.scaler.unscale_(optimizer)
            taken.append(precision.step(optimizer))
            if len(taken) == 1:  # the overflowed step left the weights as they were
                assert all(
                    torch.equal(p, b) for p, b in zip(layer.parameters(), before, strict=True)
                )
            optimizer.zero_grad()
            if taken[-1]:
                schedule.step()
            rates.append(optimizer.param_groups[0]["lr"])
    assert taken == [False, True, True] and rates == [0.1, 0.05, 0.025]
    assert Precision("fp32", torch.device("cpu")).step(optimizer)  # a plain step is taken


def test_the_loop_steps_a_per_step_schedule_only_with_the_optimizer(tmp_path: Path) -> None:
    """An fp16 run whose loss is weighted so that its first scaled gradients overflow: the
    scaler skips those steps (and halves its scale each time), and the per-step schedule
    counts only the steps the optimizer took (it counted every batch)."""
    config = toy_config(
        epochs=3,
        precision="fp16",
        loss_weights={"loss": 1e3},  # scaled by 65536: past fp16; within it at a small scale
        scheduler={"type": "StepLR", "step_size": 1, "gamma": 0.5, "interval": "step"},
    )
    result = train(config, tmp_path, device="cpu")
    state = load_checkpoint(result.run_dir / "checkpoints" / "last.pt")
    episodes = state["progress"]["episode"]
    skipped = round(math.log2(2.0**16 / state["precision"]["scale"]))  # one halving each
    assert episodes == 15 and 0 < skipped < episodes
    assert state["scheduler"]["last_epoch"] == episodes - skipped
