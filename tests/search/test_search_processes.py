"""A study outlives its processes: a worker killed mid-trial (SIGKILL) or stopped by Ctrl-C,
then `loom search --resume`: the trial is failed and its parameters run once more, nothing
lost, nothing run twice; `--workers 2` share one journal."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from search_helpers import search_study, tiny_config

import torchloom
from torchloom.cli.main import main
from torchloom.search.processes import PARENT_ENV

SEARCH = "search:\n  training.optimizer.lr: {loguniform: [1.0e-4, 1.0e-2]}\n"
SOURCE = str(Path(torchloom.__file__).parents[1])
TESTS = Path(__file__).resolve().parents[1]  # trust_components


def _env() -> dict[str, str]:
    parts = (SOURCE, str(TESTS), os.environ.get("PYTHONPATH", ""))
    path = os.pathsep.join(p for p in parts if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def _start(
    config: Path, runs: Path, trials: int, workers: int = 1, sigint_ignored: bool = False
) -> subprocess.Popen[str]:
    """`loom search`; with `sigint_ignored` as a script's background job starts it (`&`):
    with SIGINT ignored, which its own processes inherit."""
    command = [sys.executable, "-m", "torchloom.cli.main", "search", str(config)]
    command += ["--trials", str(trials), "--expdir", str(runs), "--workers", str(workers)]
    return subprocess.Popen(
        command,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        if sigint_ignored
        else None,
    )


def _wait_for_trial(runs: Path, number: int, process: subprocess.Popen[str]) -> Path:
    """The search folder, once trial `number` is training (its run wrote summary.json)."""
    deadline = time.time() + 120
    while time.time() < deadline:
        found = list(runs.glob(f"searches/*/*/trials/*/*_trial{number}/summary.json"))
        if found:
            time.sleep(0.3)  # inside the training loop
            return found[0].parents[3]
        assert process.poll() is None, process.communicate()[0]
        time.sleep(0.2)
    raise AssertionError("the trial never started")


def _rows(search_dir: Path) -> list[dict[str, str]]:
    with open(search_dir / "trials.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def _check_retried(search_dir: Path, stopped: int, reason: str) -> None:
    rows = _rows(search_dir)
    by_number = {int(r["number"]): r for r in rows}
    assert by_number[stopped]["state"] == "fail" and reason in by_number[stopped]["reason"]
    retries = [r for r in rows if r["retry_of"] == str(stopped)]
    assert len(retries) == 1 and retries[0]["state"] == "complete"
    lr = "training.optimizer.lr"
    assert retries[0][lr] == by_number[stopped][lr]  # the same parameters, once more
    complete = [r for r in rows if r["state"] == "complete"]
    assert len(complete) == 2  # --trials 2: nothing lost
    assert len({r["run_dir"] for r in complete}) == 2  # each ran once, in its own folder


@pytest.mark.slow
def test_a_worker_killed_mid_trial_is_failed_and_retried_on_resume(
    tmp_path: Path, mnist_folder: Path
) -> None:
    config = tiny_config(tmp_path, mnist_folder, SEARCH, epochs=4)  # a trial outlasts the wait
    runs = tmp_path / "runs"
    process = _start(config, runs, trials=2)
    search_dir = _wait_for_trial(runs, 0, process)
    process.send_signal(signal.SIGKILL)
    process.communicate()
    running = search_study(search_dir).get_trials(states=(optuna.trial.TrialState.RUNNING,))
    assert len(running) == 1  # the journal alone would keep it running forever
    assert main(["search", "--resume", str(search_dir)]) == 0
    _check_retried(search_dir, running[0].number, f"its process {process.pid} on ")


@pytest.mark.slow
def test_ctrl_c_stops_the_search_and_resume_runs_the_stopped_trial_again(
    tmp_path: Path, mnist_folder: Path
) -> None:
    config = tiny_config(tmp_path, mnist_folder, SEARCH, epochs=4)  # a trial outlasts the wait
    runs = tmp_path / "runs"
    process = _start(config, runs, trials=2)
    search_dir = _wait_for_trial(runs, 0, process)
    process.send_signal(signal.SIGINT)
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 130, out
    assert f"loom search --resume {search_dir}" in out
    (stopped,) = [r for r in _rows(search_dir) if r["reason"].startswith("interrupted")]
    assert main(["search", "--resume", str(search_dir)]) == 0
    _check_retried(search_dir, int(stopped["number"]), "interrupted")


@pytest.mark.slow
def test_two_workers_share_one_journal_and_stop_together_on_ctrl_c(
    tmp_path: Path, mnist_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    # Trials of about 3 s (8 epochs of 8 batches): at 2 epochs a quiet machine finished the
    # whole study before the signal came, once a trial's fixed costs were cut.
    config = tiny_config(tmp_path, mnist_folder, SEARCH, epochs=8)
    runs = tmp_path / "runs"
    process = _start(config, runs, trials=4, workers=2)
    search_dir = _wait_for_trial(runs, 1, process)  # both workers are in a trial
    process.send_signal(signal.SIGINT)  # the parent alone, as a terminal's Ctrl-C now is
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 130, out
    stopped_rows = _rows(search_dir)
    interrupted = [r for r in stopped_rows if r["reason"].startswith("interrupted")]
    assert interrupted, stopped_rows  # each worker stopped its trial, queued it
    assert main(["search", "--resume", str(search_dir), "--workers", "2"]) == 0
    rows = _rows(search_dir)
    complete = [r for r in rows if r["state"] == "complete"]
    assert len(complete) == 4 and len({r["run_dir"] for r in complete}) == 4
    retried = {r["retry_of"] for r in rows if r["retry_of"]}
    # Each stopped trial ran again, once. (Failed once in 17 runs, under load, with a trial
    # retried whose row did not say interrupted: the Ctrl-C had come between its ask and the
    # naming of its process, and the resume reaped it as dead; the stop is held over that
    # now, test_search_guards.py.)
    assert retried == {r["number"] for r in interrupted}, (stopped_rows, rows)
    pids = {t.user_attrs["pid"] for t in search_study(search_dir).trials}
    assert len(pids) >= 2  # several processes ran trials of the one study


@pytest.mark.slow
def test_a_stop_is_a_stop_whatever_error_it_turns_into_and_wherever_sigint_was_ignored(
    tmp_path: Path, mnist_folder: Path
) -> None:
    """Ctrl-C while a worker process builds its trial's pipeline (torch's modules imported:
    an import it cuts short may fail with ImportError), in a search started as a script's
    background job (SIGINT ignored, and inherited by its worker processes): the worker's
    trial is interrupted and queued, not failed as a crash, and the search stops."""
    markers = tmp_path / "building"
    markers.mkdir()
    slow = "pipeline:\n  building:\n    type: trust_components:SwallowsInterrupts\n"
    slow += f"    markers: {markers}\n    when_env: {PARENT_ENV}\n"  # in worker 1 only
    config = tiny_config(tmp_path, mnist_folder, SEARCH + slow, epochs=8)
    runs = tmp_path / "runs"
    process = _start(config, runs, trials=6, workers=2, sigint_ignored=True)
    deadline = time.time() + 120
    while not any(markers.iterdir()):  # worker 1 is building its trial
        assert process.poll() is None, process.communicate()[0]
        assert time.time() < deadline, "the worker never built its pipeline"
        time.sleep(0.05)
    (worker,) = [int(marker.name) for marker in markers.iterdir()]
    process.send_signal(signal.SIGINT)
    try:
        out, _ = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # the search went on: stop it, not to leave it running
        process.kill()
        out, _ = process.communicate()
        raise AssertionError(f"the search did not stop:\n{out}") from None
    assert process.returncode == 130, out
    assert "crashed" not in out
    trials = search_study(next(runs.glob("searches/*/*"))).trials
    stopped = [t for t in trials if t.user_attrs.get("pid") == worker]
    assert len(stopped) == 1, out  # no other trial started in that worker
    assert stopped[0].user_attrs["reason"].startswith("interrupted"), stopped[0].user_attrs
    assert any(t.user_attrs.get("retry_of") == stopped[0].number for t in trials)  # queued
