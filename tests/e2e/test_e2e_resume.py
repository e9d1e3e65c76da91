"""Exact resume: a run killed mid-epoch (SIGKILL) or stopped with Ctrl-C, then resumed, ends
bit-identical to the same run left alone. The runs stopped, and the reference, are real `loom
train` processes; the resumes (`torchloom.train(resume=...)`, the engine `loom train --resume`
runs) and the refusals (the CLI's `main()`) run in the test's process."""

from __future__ import annotations

import csv
import os
import platform
import signal
import subprocess
import time
from pathlib import Path

import pytest
from e2e_helpers import (
    LOOM,
    assert_bit_identical,
    only_run,
    run_loom,
    small_config,
    summary,
    weights,
)

import torchloom
from in_process_loom import run_loom as loom_here

OVERRIDES = [
    "training.task.subset=2048",  # 64 batches per epoch
    "training.terminal_conditions.epoch_limit=3",
    "+training.checkpoint_interval=5",
]
KILL_AFTER_EPISODE = 80  # mid-way through the second epoch


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, mnist_folder: Path) -> Path:
    folder = tmp_path_factory.mktemp("reference")
    config = small_config(folder, mnist_folder)
    done = run_loom("train", str(config), *OVERRIDES, "--expdir", str(folder / "runs"), "--quiet")
    assert done.returncode == 0, done.stderr
    return only_run(folder / "runs")


def _logged_episode(run_dirs: list[Path]) -> int:
    for run in run_dirs:
        log = run / "training_statistics.csv"
        if log.exists():
            rows = log.read_text().strip().splitlines()
            if len(rows) > 1 and rows[-1].count(",") == rows[0].count(","):
                return int(rows[-1].split(",")[0])
    return 0


def _rows(path: Path, drop: tuple[str, ...] = ()) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return [{k: v for k, v in row.items() if k not in drop} for row in csv.DictReader(handle)]


@pytest.mark.slow
@pytest.mark.parametrize("stop_signal", [signal.SIGKILL, signal.SIGINT], ids=["sigkill", "ctrl-c"])
def test_stopped_and_resumed_run_is_bit_identical(
    tmp_path: Path, mnist_folder: Path, reference: Path, stop_signal: signal.Signals
) -> None:
    config = small_config(tmp_path, mnist_folder)
    expdir = tmp_path / "runs"
    process = subprocess.Popen(
        [*LOOM, "train", str(config), *OVERRIDES, "--expdir", str(expdir), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + 240
    while _logged_episode(list(expdir.glob("*/*"))) < KILL_AFTER_EPISODE:
        assert process.poll() is None, f"the run ended before it was stopped: {process.stderr}"
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.01)
    process.send_signal(stop_signal)
    _, stderr = process.communicate(timeout=120)
    run = only_run(expdir)
    stopped = summary(run)
    if stop_signal == signal.SIGKILL:
        assert process.returncode == -signal.SIGKILL
        assert stopped["status"] == "running"  # killed: nothing had a chance to write
    else:
        assert process.returncode == 130, stderr
        assert "Traceback" not in stderr
        assert stopped["status"] == "interrupted"
    assert stopped.get("episodes", 0) < 192

    torchloom.train(resume=run)
    assert summary(run)["status"] == "epoch_limit" and summary(run)["episodes"] == 192
    assert_bit_identical(weights(reference), weights(run))
    # The statistics files are exactly those of the uninterrupted run, row for row.
    for name in ("training_epoch_statistics.csv", "validation_epoch_statistics.csv"):
        assert _rows(run / name) == _rows(reference / name), name
    timing = ("samples_per_second",)
    assert _rows(run / "training_statistics.csv", timing) == _rows(
        reference / "training_statistics.csv", timing
    )


def test_resume_refuses_overrides_and_missing_runs(
    tmp_path: Path, reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    done = loom_here(capsys, "train", "--resume", str(reference), "training.optimizer.lr=1")
    assert done.status == 2 and "training.optimizer.lr (0.001 -> 1)" in done.err
    assert "start a new run" in done.err and "Traceback" not in done.err
    done = loom_here(capsys, "train", "--resume", str(tmp_path / "nowhere"))
    assert done.status == 2 and "last.pt" in done.err and "Traceback" not in done.err
    # A config file given with --resume was read as an override ("expected KEY=VALUE").
    done = loom_here(capsys, "train", "--resume", str(reference), str(reference / "config.yaml"))
    assert done.status == 2 and "give no config file" in done.err


def test_a_resume_may_not_change_what_follows_a_limit_through_an_interpolation(
    reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """lenet5.yml's cosine schedule ends with the run (`T_max: ${...epoch_limit}`). config.yaml
    holds the resolved value (T_max: 3), so raising epoch_limit on resume was accepted and
    trained the new epoch at a rate of 0, the schedule over; the change the limit makes through
    the interpolation is refused, naming the key (the run's config as written is kept in its
    checkpoints for this)."""
    before = (reference / "summary.json").read_text()
    done = loom_here(
        capsys, "train", "--resume", str(reference), "training.terminal_conditions.epoch_limit=4"
    )
    assert done.status == 2, done.out + done.err
    assert "training.scheduler.T_max (3 -> 4)" in done.err and "Traceback" not in done.err
    assert "interpolation" in done.err
    assert (reference / "summary.json").read_text() == before


def test_the_config_as_written_is_the_run_s_with_the_overrides_of_its_resumes(
    reference: Path,
) -> None:
    """What checkpoints keep: the `${...}` as written, the seed the run drew, and after a resume
    its overrides, with no name that the run's config did not set."""
    from torchloom.engine.checkpoint import load_checkpoint
    from torchloom.engine.resume import written_with_overrides

    written = load_checkpoint(reference / "checkpoints" / "last.pt")["config_written"]
    assert "T_max: ${training.terminal_conditions.epoch_limit}" in written
    assert "seed: 7" in written and "python_pipeline" not in written
    again = written_with_overrides(written, ["training.logging_interval=4"], "--resume")
    assert "logging_interval: 4" in again and "python_pipeline" not in again


@pytest.mark.parametrize(
    ("status", "advice"),
    [
        ("episode_limit", "training.terminal_conditions.episode_limit=N"),
        ("early_stopped", "training.terminal_conditions.early_stopping.patience=N"),
        ("epoch_limit", "training.terminal_conditions.epoch_limit=N"),
        ("converged", "start a new run"),
    ],
)
def test_a_finished_run_is_told_how_to_continue_by_what_ended_it(
    tmp_path: Path, status: str, advice: str
) -> None:
    """It always advised raising epoch_limit, which does nothing for a run ended otherwise."""
    from torchloom.cli.train import finished_message
    from torchloom.engine.run_folder import RunResult

    message = finished_message(RunResult(tmp_path, {"status": status, "reason": "..."}))
    assert advice in message


@pytest.mark.skipif(platform.system() != "Linux", reason="torch's THP allocation is Linux's")
def test_the_loom_command_puts_large_cpu_tensors_on_huge_pages(reference: Path) -> None:
    # `loom` sets THP_MEM_ALLOC_ENABLE before torch starts (torchloom/host_memory.py); the run
    # checked what torch actually did.
    log = (reference / "run.log").read_text(encoding="utf-8")
    assert "CPU tensors of 2 MiB or more on huge pages: yes" in log
