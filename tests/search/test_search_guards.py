"""What a search refuses or cleans up rather than going wrong quietly: another search's study
in a shared storage, a study that is gone, options a resumed search cannot change, workers
that crash or outlive `loom search`, a trial that another process finished first."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from search_helpers import search_study, tiny_config

import torchloom
from live_processes import alive, children
from torchloom.api import TrainOptions
from torchloom.cli.main import main
from torchloom.search import processes, runner, worker
from torchloom.search.trial import Objective, TrialFailed
from torchloom.signals import stop_asked, stopping_on_signals

SEARCH = "search:\n  training.optimizer.lr: {loguniform: [1.0e-4, 1.0e-2]}\n"
OTHER = "search:\n  training.optimizer.lr: {loguniform: [1.0e-3, 1.0e-1]}\n"
SOURCE = str(Path(torchloom.__file__).parents[1])


def _search_dir(runs: Path) -> Path:
    (found,) = (runs / "searches").glob("*/*")
    return found


def _search(config: Path, runs: Path, *extra: str) -> int:
    return main(["search", str(config), "--trials", "1", "--expdir", str(runs), *extra])


def _journal(path: Path) -> optuna.storages.BaseStorage:
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    return JournalStorage(JournalFileBackend(str(path)))


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory, mnist_folder: Path) -> Path:
    """One finished search of one trial, for the tests that only read it."""
    folder = tmp_path_factory.mktemp("searched")
    config = tiny_config(folder, mnist_folder, SEARCH)
    assert _search(config, folder / "runs") == 0
    return _search_dir(folder / "runs")


def test_a_search_refuses_another_searchs_study_in_a_shared_storage(
    tmp_path: Path, mnist_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shared = tmp_path / "shared.journal"
    storage = ["--storage", f"journal:{shared}"]
    first = tmp_path / "first"
    first.mkdir()
    assert _search(tiny_config(first, mnist_folder, SEARCH), tmp_path / "runs1", *storage) == 0
    capsys.readouterr()
    second = tmp_path / "second"
    second.mkdir()
    other = tiny_config(second, mnist_folder, OTHER)  # the same name, 'tiny'; another space
    runs = tmp_path / "runs2"
    assert _search(other, runs, *storage) == 2
    error = capsys.readouterr().err
    assert str(shared) in error and "study 'tiny'" in error and "--study NAME" in error
    assert "config and space digest" in error
    assert not runs.exists()  # nothing left behind
    assert _search(other, runs, *storage, "--mode", "min") == 2
    error = capsys.readouterr().err
    assert "its direction is maximize, this search's is minimize" in error, error
    # The same search again (another machine, say) joins its study: nothing left to run.
    again = tmp_path / "runs3"
    assert _search(tiny_config(first, mnist_folder, SEARCH), again, *storage) == 0
    assert len(optuna.load_study(storage=_journal(shared), study_name="tiny").trials) == 1
    # Its own name: a study of its own in the same storage.
    assert _search(other, runs, *storage, "--study", "other") == 0


def test_resume_and_report_refuse_a_study_made_again_by_another_search(
    tmp_path: Path, mnist_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shared = tmp_path / "shared.journal"
    storage = ["--storage", f"journal:{shared}"]
    assert _search(tiny_config(tmp_path, mnist_folder, SEARCH), tmp_path / "runs1", *storage) == 0
    search_dir = _search_dir(tmp_path / "runs1")
    optuna.delete_study(study_name="tiny", storage=_journal(shared))
    other = tiny_config(tmp_path, mnist_folder, OTHER)
    # Another search takes the name, with a timeout so short that it runs no trial.
    assert _search(other, tmp_path / "runs2", *storage, "--timeout", "1e-9") == 0
    capsys.readouterr()
    assert main(["search", "--resume", str(search_dir), "--trials", "2"]) == 2
    error = capsys.readouterr().err
    assert "study 'tiny'" in error and "belongs to another search" in error
    assert main(["report", str(search_dir)]) == 2
    assert "belongs to another search" in capsys.readouterr().err
    assert len(optuna.load_study(storage=_journal(shared), study_name="tiny").trials) == 0


def test_a_missing_journal_or_study_is_a_config_error_not_a_traceback(
    tmp_path: Path, mnist_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tiny_config(tmp_path, mnist_folder, SEARCH)
    assert _search(config, tmp_path / "runs", "--timeout", "1e-9") == 0
    search_dir = _search_dir(tmp_path / "runs")
    journal = search_dir / "study.journal"
    journal.unlink()
    capsys.readouterr()
    assert main(["search", "--resume", str(search_dir)]) == 2
    error = capsys.readouterr().err
    assert str(journal) in error and "study 'tiny'" in error and "does not exist" in error
    assert main(["report", str(search_dir)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not journal.exists()  # not made again, empty, by opening it
    # A study deleted (or renamed) in its storage.
    shared = tmp_path / "shared.journal"
    runs = tmp_path / "runs2"
    assert _search(config, runs, "--storage", f"journal:{shared}", "--timeout", "1e-9") == 0
    optuna.delete_study(study_name="tiny", storage=_journal(shared))
    capsys.readouterr()
    assert main(["search", "--resume", str(_search_dir(runs))]) == 2
    error = capsys.readouterr().err
    assert str(shared) in error and "study 'tiny'" in error and "not in this storage" in error


@pytest.mark.parametrize(
    "option",
    [
        ["--sampler", "random"],
        ["--pruner", "median"],
        ["--seed", "3"],
        ["--storage", "journal:/tmp/elsewhere.journal"],
        ["--study", "other"],
        ["--monitor", "validation.accuracy"],
        ["--mode", "max"],
        ["--space", "space.yml"],
        ["--device", "cpu"],
        ["--trials", "0"],
        ["--trials", "-2"],
        ["--timeout", "-1"],
        ["--timeout", "0"],
    ],
)
def test_resume_refuses_what_a_resumed_search_cannot_change(
    searched: Path, option: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    before = (searched / "search.json").read_text()
    assert main(["search", "--resume", str(searched), *option]) == 2
    assert f"command line: {option[0]}: " in capsys.readouterr().err
    assert (searched / "search.json").read_text() == before


class _Stdin:
    told: list[bytes] = []

    def __init__(self) -> None:
        self.closed, self.data = False, b""

    def write(self, data: bytes) -> None:
        self.data += data

    def close(self) -> None:
        self.closed = True
        _Stdin.told.append(self.data)


class _Worker:
    """A stand-in for a worker process that exits with `code`."""

    def __init__(self, code: int) -> None:
        self.code = code
        self.returncode: int | None = None
        self.pid = 0
        self.stdin = _Stdin()  # where WorkerProcesses.begin names the search folder

    def wait(self, timeout: float | None = None) -> int:
        self.returncode = self.code
        return self.code

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, signum: int) -> None:
        pass

    terminate = kill = lambda self: None


@pytest.mark.parametrize(
    ("codes", "status"),
    [((0,), 0), ((1,), 1), ((2, 1), 2), ((1, 130), 130), ((0, -9), 137)],
)
def test_the_search_fails_when_a_worker_does(
    searched: Path, monkeypatch: pytest.MonkeyPatch, codes: tuple[int, ...], status: int
) -> None:
    """`--workers K`: worker 0 runs in `loom search` itself (one process start-up fewer), the
    other K - 1 in processes of their own, whose exit statuses make the search's."""
    pending = list(codes)
    started: list[list[str]] = []

    def start(command: list[str], **kwargs: object) -> _Worker:
        started.append(command)
        return _Worker(pending.pop(0))

    here: list[int] = []
    monkeypatch.setattr(processes.subprocess, "Popen", start)
    monkeypatch.setattr(worker, "work", lambda *a, worker, **k: here.append(worker))
    monkeypatch.setattr(_Stdin, "told", [])
    record = processes.read_record(searched)
    assert processes.run_workers(searched, record, len(codes) + 1) == status
    assert here == [0]
    assert [command[-1] for command in started] == [str(i) for i in range(1, len(codes) + 1)]
    # Each was started before it knew the search (`--worker`), then told it on stdin.
    assert all("--worker" in command for command in started)
    told = [json.loads(line)["search_dir"] for line in _Stdin.told]
    assert told == [str(searched)] * len(codes)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(
    ("signum", "after"),
    [
        (signal.SIGKILL, 3.0),
        (signal.SIGHUP, 3.0),  # during the trials
        (signal.SIGHUP, 0.0),  # while `loom search` still imports torch and reads the config
    ],
)
def test_no_worker_outlives_a_killed_loom_search(
    tmp_path: Path, mnist_folder: Path, signum: int, after: float
) -> None:
    config = tiny_config(tmp_path, mnist_folder, SEARCH, epochs=3)
    runs = tmp_path / "runs"
    path = os.pathsep.join(p for p in (SOURCE, os.environ.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "torchloom.cli.main", "search", str(config)]
    command += ["--trials", "50", "--expdir", str(runs), "--workers", "2"]
    said = tmp_path / "stderr.txt"  # what the search printed, shown if it fails
    with said.open("wb") as stderr:
        process = subprocess.Popen(
            command,
            env={**os.environ, "PYTHONPATH": path},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            # as from a terminal: SIGHUP not ignored, even where this test runs under nohup
            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
        )
    workers: set[int] = set()
    deadline = time.time() + 180
    while time.time() < deadline and not workers:
        workers = children(process.pid)
        time.sleep(0.2)
    assert workers, "no worker started"
    time.sleep(after)
    workers |= children(process.pid)
    process.send_signal(signum)
    code = process.wait(timeout=180)
    if signum == signal.SIGHUP:  # a closed terminal stops the search as Ctrl-C does
        assert code == 130, said.read_text(errors="replace")[-3000:]
    deadline = time.time() + 90
    while time.time() < deadline and any(alive(pid) for pid in workers):
        time.sleep(0.5)
    left = [pid for pid in workers if alive(pid)]
    for pid in left:  # not to leave them running after a failure either
        os.kill(pid, signal.SIGKILL)
    assert not left, f"workers {left} outlived loom search"


def test_search_uses_the_public_training_api_not_engine_internals() -> None:
    """DESIGN.md: search runs trials through the public training API (torchloom.api)."""
    import ast

    folder = Path(runner.__file__).parent
    internal = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "torchloom.engine"
            ):
                internal.append(f"{path.name}: {node.module}")
            if isinstance(node, ast.Import):
                internal += [
                    f"{path.name}: {a.name}"
                    for a in node.names
                    if a.name.startswith("torchloom.engine")
                ]
    assert not internal


def test_check_training_returns_the_run_statistics(tmp_path: Path, mnist_folder: Path) -> None:
    from torchloom.api import check_training

    statistics = check_training(tiny_config(tmp_path, mnist_folder))
    assert {"training.loss", "validation.loss", "validation.accuracy"} <= statistics


def test_workers_started_for_a_search_that_never_begins_are_stopped(
    tmp_path: Path,
    mnist_folder: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """`loom search --workers K` starts its K - 1 worker processes before it reads the
    config (their start-up then overlaps its own); a config it refuses stops them all,
    silently (each printed 'interrupted' before the error)."""
    started: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def spy(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        started.append(real_popen(*args, **kwargs))  # type: ignore[call-overload]
        return started[-1]

    monkeypatch.setattr(processes.subprocess, "Popen", spy)
    real_prepare = runner.prepare_search

    def slow_prepare(*args: object, **kwargs: object) -> object:
        time.sleep(1.5)  # as `loom search` importing torch: the workers are starting up
        return real_prepare(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "prepare_search", slow_prepare)
    bad = "search:\n  training.optimizer.lr: {loguniform: [1.0, 0.1]}\n"  # low > high
    config = tiny_config(tmp_path, mnist_folder, bad)
    assert main(["search", str(config), "--workers", "3", "--expdir", str(tmp_path / "r")]) == 2
    assert len(started) == 2
    assert all(process.poll() is not None for process in started)  # none outlives the command
    assert not (tmp_path / "r").exists()
    assert "interrupted" not in capfd.readouterr().err


@pytest.mark.parametrize(
    "when",
    ["drawing its values", "in a draw", "as its run folder is made", "at its end"],
)
def test_a_trial_another_process_finished_is_dropped_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """Two processes handed one queued trial (Optuna's own gRPC proxy, or one SQLite file
    shared by two search folders: docs/search.md), or a trial failed for a stopped heartbeat
    that then goes on: the other process finishes it first, at any moment of this one's run.
    This worker keeps the other's ending, says so and goes on; before, each of the three
    crashed it (ValueError or UpdateFinishedTrialError)."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(storage=url, study_name="s")
    study.enqueue_trial({"x": 1.0})
    trial = study.ask()
    other = optuna.load_study(storage=url, study_name="s")  # the other process

    def propose(trial: optuna.Trial) -> worker.Proposal:
        trial.suggest_float("x", 0.0, 2.0)
        if when == "drawing its values":
            other.tell(trial.number, 5.0)
        if when == "in a draw":  # Optuna's refusal comes out of the builder's own draw
            other.tell(trial.number, 5.0)
            trial.suggest_float("y", 0.0, 1.0)
        return tmp_path / "config.yml", [], {"x": 1.0}

    def run_trial(
        trial: optuna.Trial, source: Path, overrides: list[str], *args: object
    ) -> tuple[float, None]:
        on_run_dir = args[-1]
        run_dir = tmp_path / "trials" / "run"
        run_dir.mkdir(parents=True)
        (run_dir / "config.yaml").write_text("name: run\n", encoding="utf-8")
        if when == "as its run folder is made":
            other.tell(trial.number, 5.0)
            try:
                on_run_dir(run_dir)  # type: ignore[operator]
            except Exception as error:  # as run_trial turns a crash into a failed trial
                raise TrialFailed(f"crashed: {error}", run_dir) from error
        if when == "at its end":
            other.tell(trial.number, 5.0)
        return 1.0, None

    monkeypatch.setattr(worker, "run_trial", run_trial)
    said: list[str] = []
    options = TrainOptions(expdir=str(tmp_path / "trials"), quiet=True)
    objective = Objective("validation.loss", "min")
    worker._run_one(study, trial, propose, tmp_path, objective, options, said.append)
    assert said == [f"trial {trial.number}: finished by another process; this run of it is dropped"]
    (kept,) = other.trials
    assert kept.state.name == "COMPLETE" and kept.value == 5.0


def test_a_search_under_nohup_keeps_ignoring_a_closed_terminal() -> None:
    """`nohup loom search ...` (SIGHUP ignored) goes on when its terminal closes; otherwise
    SIGHUP stops it as Ctrl-C does."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stopping_on_signals():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        with stopping_on_signals():
            assert not stop_asked()
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGHUP)
                time.sleep(5)  # the handler raises as soon as the signal is taken
            assert stop_asked()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_an_interrupt_python_cannot_raise_is_not_printed_as_an_ignored_exception(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Ctrl-C of `loom search` printed "Exception ignored in: <function WeakKeyDictionary
    ...> ... KeyboardInterrupt" with a traceback: the handler's KeyboardInterrupt came while a
    weakref callback ran, where Python can only report it. The stop is recorded in any case."""
    import gc
    import sys
    import weakref

    reported: list[type[BaseException]] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: reported.append(info.exc_type))

    class Held:
        pass

    def interrupted(_: object) -> None:
        raise KeyboardInterrupt  # as the signal handler does, inside the callback

    def failing(_: object) -> None:
        raise ValueError("an error of its own")

    with stopping_on_signals():
        for callback in (interrupted, failing):
            held = Held()
            reference = weakref.ref(held, callback)
            del held
            gc.collect()
            assert reference() is None
    assert reported == [ValueError]  # anything else is still reported


def test_the_loser_of_two_processes_creating_an_sqlite_study_tries_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two `loom search` on a fresh SQLite file at once: the second to create the tables was
    refused 'UNIQUE constraint failed: alembic_version.version_num' (1 time in 5 by hand) and
    its search ended; it now opens the tables the first made."""
    from torchloom.search import study as study_module

    calls: list[str] = []

    class RacingStorage:
        def __init__(self, url: str, **kw: object) -> None:
            calls.append(url)
            if len(calls) == 1:
                raise RuntimeError(
                    "(sqlite3.IntegrityError) UNIQUE constraint failed: alembic_version.version_num"
                )

    monkeypatch.setattr(optuna.storages, "RDBStorage", RacingStorage)
    monkeypatch.setattr(study_module.time, "sleep", lambda seconds: None)
    assert isinstance(study_module.open_storage("sqlite:///fresh.db"), RacingStorage)
    assert len(calls) == 2


def test_an_sqlite_file_that_cannot_be_made_is_named_as_a_file(tmp_path: Path) -> None:
    from torchloom.search.study import StorageUnreachable, open_storage

    url = f"sqlite:///{tmp_path / 'missing' / 'studies.db'}"
    with pytest.raises(StorageUnreachable) as refused:
        open_storage(url)
    message = refused.value.format()
    assert "cannot open the SQLite database" in message and "folder exists" in message
    assert "server runs" not in message


def test_a_journal_file_that_cannot_be_made_is_named(tmp_path: Path) -> None:
    from torchloom.search.study import StorageUnreachable, open_storage

    with pytest.raises(StorageUnreachable) as refused:
        open_storage(f"journal:{tmp_path / 'missing' / 'study.journal'}")
    message = refused.value.format()
    assert "cannot open the journal file" in message and "folder exists" in message


@pytest.mark.parametrize("landed", ["before the value is stored", "after it is stored"])
def test_a_stop_while_a_finished_trial_is_recorded_leaves_no_running_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, landed: str
) -> None:
    """Ctrl-C (or SIGTERM) can land while a worker records the value of a trial that just
    ended. Before the value is stored, the trial is failed as interrupted and queued again, as
    one stopped mid-run; after, it stays complete and nothing is queued. Before, the stop left
    the trial RUNNING: the search's trials.csv said so, and only a resume failed it, as one
    whose process had died."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="s")
    trial = study.ask()

    def propose(trial: optuna.Trial) -> worker.Proposal:
        trial.suggest_float("x", 0.0, 2.0)
        return tmp_path / "config.yml", [], {"x": 1.0}

    def run_trial(*args: object) -> tuple[float, None]:
        return 1.0, None

    real_tell = worker._tell

    def tell(
        study: optuna.Study, trial: optuna.Trial, value: float | None = None, **kw: Any
    ) -> None:
        if value is not None and landed == "before the value is stored":
            raise KeyboardInterrupt
        real_tell(study, trial, value, **kw)
        if value is not None:
            raise KeyboardInterrupt

    monkeypatch.setattr(worker, "run_trial", run_trial)
    monkeypatch.setattr(worker, "_tell", tell)
    options = TrainOptions(expdir=str(tmp_path / "trials"), quiet=True)
    objective = Objective("validation.loss", "min")
    said: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        worker._run_one(study, trial, propose, tmp_path, objective, options, said.append)
    states = {t.number: t.state.name for t in study.trials}
    if landed == "before the value is stored":
        assert states == {0: "FAIL", 1: "WAITING"}  # queued again, as a trial stopped mid-run
        assert study.trials[0].user_attrs["reason"].startswith("interrupted")
        assert study.trials[1].user_attrs["retry_of"] == 0
        assert said == ["trial 0: interrupted; its parameters are queued for the next run"]
    else:
        assert states == {0: "COMPLETE"} and study.trials[0].value == 1.0
        assert not any("another process" in line for line in said)  # it was this one's


def test_a_stop_while_a_trial_is_claimed_fails_and_queues_it_again(
    tmp_path: Path, mnist_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C between the ask and the naming of the trial's process left the trial RUNNING
    for good, named by no one (no reaper could judge it): the resumed search counted it and
    ran one trial too few, and its values were never tried (CI: a trial retried without an
    'interrupted' reason). The stop is held to the end of the naming, then fails the trial
    and queues it as a stop mid-run does."""
    named = worker.record_identity
    stopped: list[int] = []

    def named_after_a_ctrl_c(trial: optuna.Trial) -> None:
        if not stopped:
            stopped.append(trial.number)
            os.kill(os.getpid(), signal.SIGINT)  # as the ask returns
        named(trial)

    def run_trial(trial: optuna.Trial, *args: Any) -> tuple[float, None]:
        options, on_run_dir = args[-2], args[-1]
        run_dir = Path(options.expdir) / f"trial{trial.number}"
        run_dir.mkdir(parents=True)
        (run_dir / "config.yaml").write_text("name: run\n", encoding="utf-8")
        on_run_dir(run_dir)
        return float(trial.number), None

    monkeypatch.setattr(worker, "record_identity", named_after_a_ctrl_c)
    monkeypatch.setattr(worker, "run_trial", run_trial)
    config = tiny_config(tmp_path, mnist_folder)
    space = {"training.optimizer.lr": {"loguniform": [1.0e-4, 1.0e-2]}}
    with pytest.raises(KeyboardInterrupt):
        torchloom.search(config, space=space, trials=2, expdir=str(tmp_path / "runs"))
    (search_dir,) = (tmp_path / "runs").glob("searches/*/*")
    found = torchloom.search(None, resume=search_dir)
    rows = {int(row["number"]): row for row in found.trials}
    assert rows[0]["state"] == "fail" and "interrupted" in str(rows[0]["reason"]), rows
    complete = [row for row in rows.values() if row["state"] == "complete"]
    assert len(complete) == 2 and [str(r["retry_of"]) for r in complete].count("0") == 1, rows


def test_a_held_stop_comes_at_the_blocks_end_and_a_second_one_at_once() -> None:
    from torchloom.signals import stops_held

    reached = []
    with stopping_on_signals():
        with pytest.raises(KeyboardInterrupt), stops_held():
            os.kill(os.getpid(), signal.SIGINT)
            reached.append("after the first")
        with pytest.raises(KeyboardInterrupt), stops_held():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # a block stuck on a database: the second signal ends it
            reached.append("after the second")
    assert reached == ["after the first"]
    # A stop held over a block that then fails (a database error) is still the stop.
    with stopping_on_signals():
        with pytest.raises(KeyboardInterrupt) as stopped, stops_held():
            os.kill(os.getpid(), signal.SIGINT)
            raise ConnectionError("the database went away")
        assert isinstance(stopped.value.__cause__, ConnectionError)
    # Held only in the main thread, where signals are handled (a search in a thread held the
    # main thread's first Ctrl-C); a block inside another holds nothing more.
    import threading

    done: list[bool] = []

    def in_a_thread() -> None:
        with stops_held(), stops_held():
            done.append(True)

    thread = threading.Thread(target=in_a_thread)
    with stopping_on_signals(), stops_held():
        thread.start()
        thread.join()
        with stops_held():
            done.append(True)
    assert done == [True, True]


def test_a_failure_while_a_trial_is_claimed_fails_and_queues_it_again(
    tmp_path: Path, mnist_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database error while the worker names the trial's process ended the worker and left
    the trial RUNNING, unnamed: no reaper could judge it, and it counted for ever."""

    def database_gone(trial: optuna.Trial) -> None:
        trial.set_user_attr("pid_start", "1")
        raise ConnectionError("the database went away")

    monkeypatch.setattr(worker, "record_identity", database_gone)
    config = tiny_config(tmp_path, mnist_folder)
    space = {"training.optimizer.lr": {"loguniform": [1.0e-4, 1.0e-2]}}
    with pytest.raises(ConnectionError):
        torchloom.search(config, space=space, trials=1, expdir=str(tmp_path / "runs"))
    (search_dir,) = (tmp_path / "runs").glob("searches/*/*")
    (trial, *queued) = search_study(search_dir).trials
    assert trial.state.name == "FAIL" and [t.state.name for t in queued] == ["WAITING"]
    reason = trial.user_attrs["reason"]
    assert reason == "its worker failed: ConnectionError: the database went away"


def test_a_stop_as_the_api_creates_a_shared_study_leaves_it_whole(
    tmp_path: Path, mnist_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchloom.search created its study outside the stop handling: a Ctrl-C just after the
    creation left a study without its identity, which every later search of that name
    refused, this one run again included."""
    created = optuna.create_study

    def then_ctrl_c(*args: Any, **kwargs: Any) -> optuna.Study:
        study = created(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        return study

    monkeypatch.setattr(optuna, "create_study", then_ctrl_c)
    config = tiny_config(tmp_path, mnist_folder)
    shared = {"storage": f"journal:{tmp_path / 'shared.journal'}", "study": "shared"}
    space = {"training.optimizer.lr": {"loguniform": [1.0e-4, 1.0e-2]}}
    with pytest.raises(KeyboardInterrupt):
        torchloom.search(config, space=space, trials=1, expdir=str(tmp_path / "a"), **shared)
    monkeypatch.setattr(optuna, "create_study", created)
    monkeypatch.setattr(worker, "run_trial", lambda *args: (1.0, None))
    found = torchloom.search(config, space=space, trials=1, expdir=str(tmp_path / "b"), **shared)
    assert [row["state"] for row in found.trials] == ["complete"]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("config", "/etc/passwd"),
        ("space", "../other/space.yml"),
        ("storage", "journal:../victim/study.journal"),
    ],
)
def test_a_search_record_naming_files_outside_its_folder_is_refused(
    tmp_path: Path, key: str, value: str
) -> None:
    """A search folder may come from someone else: `--resume` read the config it named
    wherever it was, and resumed into the study of the journal it named (another search's,
    which took a trial it never ran)."""
    from torchloom.errors import ConfigError
    from torchloom.search.record import RECORD, SearchRecord, read_record

    # What `loom search` writes: its own journal (or one named by `--storage journal:NAME`),
    # and a code-first search's config ("").
    for storage, config in (("journal:mine.journal", ""), ("journal:study.journal", "config.yaml")):
        record = SearchRecord("s", "s", storage, "validation.loss", "min", 1, config=config)
        record.save(tmp_path)
        assert read_record(tmp_path) == record
    data = json.loads((tmp_path / RECORD).read_text())
    (tmp_path / RECORD).write_text(json.dumps({**data, key: value}))
    with pytest.raises(ConfigError) as refused:
        read_record(tmp_path)
    assert f"key '{key}'" in refused.value.format() or key in refused.value.format()


def test_a_missing_sqlite_database_is_not_made_by_a_resume(tmp_path: Path) -> None:
    from torchloom.errors import ConfigError
    from torchloom.search.study import load_study

    database = tmp_path / "elsewhere.db"
    with pytest.raises(ConfigError, match="the SQLite file does not exist"):
        load_study(f"sqlite:///{database}", "s", None, None)
    assert not database.exists()


def test_a_search_folder_with_symbolic_links_is_not_written_into(tmp_path: Path) -> None:
    """`trials -> ../elsewhere` in a search folder from someone else: a resume would train
    its trials' run folders there."""
    from torchloom.errors import ConfigError
    from torchloom.search.record import SearchRecord, read_record

    SearchRecord("s", "s", "journal:study.journal", "validation.loss", "min", 1).save(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    search = tmp_path / "search"
    search.mkdir()
    (tmp_path / "search.json").rename(search / "search.json")
    (search / "trials").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match=r"holds symbolic links \(trials\)"):
        read_record(search)


def test_the_lock_a_worker_holds_on_the_journal_is_no_link_to_refuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A journal's writer holds `study.journal.lock`, a link to the journal, for a moment: a
    `--workers 2` resume whose other worker was writing was refused, by chance. A link of that
    name leading elsewhere, a loop, and another `.lock` link are still refused."""
    from torchloom.errors import ConfigError
    from torchloom.search.record import SearchRecord, read_record

    SearchRecord("s", "s", "journal:study.journal", "validation.loss", "min", 1).save(tmp_path)
    (tmp_path / "study.journal").write_text("", encoding="utf-8")
    lock = tmp_path / "study.journal.lock"
    lock.symlink_to(tmp_path / "study.journal")  # as optuna's JournalFileSymlinkLock makes it
    assert read_record(tmp_path).storage == "journal:study.journal"
    lock.unlink()
    lock.symlink_to("study.journal")  # relative, as the kernel follows it
    read_record(tmp_path)
    (tmp_path / "deep").mkdir()
    monkeypatch.chdir(tmp_path / "deep")  # "study.journal" from here is elsewhere: no matter
    read_record(tmp_path)
    outside = tmp_path.parent / f"{tmp_path.name}_outside"
    outside.mkdir()
    (outside / "study.journal").write_text("", encoding="utf-8")
    hostile = {
        "study.journal.lock": outside / "study.journal",  # the same name, outside
        "x.lock": "x.lock",  # a loop: was a RuntimeError traceback
        ".ask.lock": "study.journal",  # another lock's name
    }
    for name, target in hostile.items():
        lock.unlink(missing_ok=True)
        (tmp_path / name).symlink_to(target)
        with pytest.raises(ConfigError, match=rf"holds symbolic links \({re.escape(name)}\)"):
            read_record(tmp_path)
        (tmp_path / name).unlink()
