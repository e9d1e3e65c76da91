"""--trials N means N trials across every process of a study, even where no common lock
covers them: processes counting and asking at the same moment (claim_race.py) on one journal
from three folders, without the lock, hand back the trials over the budget (claim_trial).
The locked case, on PostgreSQL, is in test_search_postgres.py; on a journal, `--workers` in
test_search_processes.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from search_helpers import IDENTITY, claim_race

from torchloom.search.claims import counted_trials
from torchloom.search.study import create_study, load_study


def test_processes_without_a_common_lock_start_exactly_the_budget(tmp_path: Path) -> None:
    url = f"journal:{tmp_path / 'shared.journal'}"
    create_study(url, "race", IDENTITY)
    claim_race(tmp_path, url, "race", budget=6, mode="unlocked")
    study = load_study(url, "race", None, None)
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    # Handed-back trials go back to the queue (WAITING) and are run or left waiting.
    assert len(complete) == 6 and counted_trials(study) == 6
    assert {t.state.name for t in study.trials} <= {"COMPLETE", "WAITING"}


def test_searches_sharing_a_journal_file_start_exactly_the_budget(tmp_path: Path) -> None:
    """A journal outside the search folders (`--storage journal:PATH`) is locked beside its
    file, under a name of its own: Optuna's lock of the journal is `PATH.lock`."""
    url = f"journal:{tmp_path / 'shared.journal'}"
    create_study(url, "race", IDENTITY)
    claim_race(tmp_path, url, "race", budget=6, mode="exact")
    study = load_study(url, "race", None, None)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 6


def test_a_trial_without_heartbeats_is_failed_with_its_reason_and_retried_once(
    tmp_path: Path,
) -> None:
    """On a database, another machine's silent trial (its host is not this one) is failed by
    Optuna's heartbeat check with a reason, and its retry counts instead of it."""
    import time

    import optuna
    from optuna.storages import RDBStorage

    from torchloom.search.claims import reap_dead_trials

    storage = RDBStorage(
        f"sqlite:///{tmp_path / 'study.db'}",
        heartbeat_interval=1,
        grace_period=1,
    )
    study = optuna.create_study(storage=storage, study_name="silent")
    trial = study.ask()
    trial.suggest_float("lr", 1e-4, 1e-1, log=True)
    trial.set_user_attr("host", "another-machine")
    storage.record_heartbeat(trial._trial_id)
    time.sleep(2.5)
    assert reap_dead_trials(study) == [0]
    failed, retry = study.trials
    assert failed.state.name == "FAIL" and retry.state.name == "WAITING"
    assert failed.user_attrs["reason"].startswith("no heartbeat from another-machine for 1 s")
    assert failed.user_attrs["retried"] is True and retry.user_attrs["retry_of"] == 0
    assert retry.system_attrs["fixed_params"] == failed.params and counted_trials(study) == 0


def test_a_live_workers_trial_is_never_failed_while_it_names_its_process() -> None:
    """A worker names its trial's process in three writes, and another machine's worker may
    reap between two of them (a search server: no lock covers both). Read after each write,
    the live worker's trial must stay RUNNING: it was failed as 'its process died' when the
    PID was read before its start time (CI, two searches through `loom search-server`)."""
    import os
    import socket

    import optuna

    from torchloom.search.claims import is_dead, reap_dead_trials, record_identity

    # A record written in another order (an older worker's: host, PID, start time) is not
    # judged before it is whole either.
    assert is_dead({"host": socket.gethostname(), "pid": os.getpid()}) is None
    study = optuna.create_study()
    trial = study.ask()
    reaped: list[int] = []
    write = trial.set_user_attr

    def write_then_reap(key: str, value: object) -> None:
        write(key, value)
        reaped.extend(reap_dead_trials(study))

    trial.set_user_attr = write_then_reap  # type: ignore[method-assign]
    record_identity(trial)
    assert reaped == [] and [t.state.name for t in study.trials] == ["RUNNING"]
    assert {"host", "pid", "pid_start"} <= set(study.trials[0].user_attrs)


def test_a_trial_finished_while_it_is_reaped_is_left_to_its_ending() -> None:
    """A trial read RUNNING with a dead process, finished before the reaper's writes (by
    another machine's reaper, or its worker on another host told it): the reaper's first
    write raised out of the search, which ended with no results written."""
    import subprocess
    import sys

    import optuna

    from torchloom.search.claims import reap_dead_trials, record_identity

    study = optuna.create_study()
    trial = study.ask()
    record_identity(trial)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    trial.set_user_attr("pid", int(gone.stdout))  # a process that has ended
    storage = study._storage
    write = storage.set_trial_user_attr

    def finished_first(trial_id: int, key: str, value: object) -> None:
        if storage.get_trial(trial_id).state.name == "RUNNING" and key == "reason":
            study.tell(trial, 1.0)  # the other process, a moment earlier
        write(trial_id, key, value)

    storage.set_trial_user_attr = finished_first  # type: ignore[method-assign]
    assert reap_dead_trials(study) == []
    assert [t.state.name for t in study.trials] == ["COMPLETE"]


def test_a_complete_trial_shows_no_reason_a_losing_reaper_wrote() -> None:
    """A reaper writes its reason before it fails the trial; the trial's worker may tell the
    value in between, and the reaper then fails nothing: trials.csv showed 'no heartbeat'
    beside the value."""
    from types import SimpleNamespace

    import optuna

    from torchloom.search.results import trial_rows

    study = optuna.create_study()
    trial = study.ask()
    trial.set_user_attr("reason", "no heartbeat from vm for 90 s: its process or machine stopped")
    study.tell(trial, 1.0)
    (row,) = trial_rows(study, SimpleNamespace(monitor="validation.loss"))  # type: ignore[arg-type]
    assert row["state"] == "complete" and row["reason"] == ""


def test_a_trial_of_a_container_sharing_this_hosts_name_is_not_judged_here() -> None:
    """Containers started with the host's network (`--network host`, Kubernetes'
    hostNetwork) share its name but not its PIDs: a live trial of theirs was judged dead."""
    import os
    import socket

    from torchloom.search.claims import is_dead, pid_space, process_start

    gone = {
        "host": socket.gethostname(),
        "pid": 2**22 + 1,  # above Linux's PID limit: no process here has it
        "pid_start": "1",
    }
    boot, _, namespace = pid_space().partition(":")
    assert is_dead({**gone, "pid_space": f"{boot}:{int(namespace) + 1}"}) is None
    assert is_dead({**gone, "pid_space": pid_space()}) is True
    assert is_dead(gone) is True  # recorded before the PID space was
    # Another boot (a power cut, then a resume): every process of that boot is gone.
    alive_then = {**gone, "pid": os.getpid(), "pid_start": process_start(os.getpid())}
    assert is_dead({**alive_then, "pid_space": f"another-boot:{namespace}"}) is True
    assert os.getpid() < 2**22 + 1


def test_a_study_whose_identity_could_not_be_written_is_not_left_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop between the study's creation and its identity's write left a study that every
    later search of that name refused ('has no search identity'), the same search run again
    included: the creation is undone."""
    import optuna

    url = f"journal:{tmp_path / 'shared.journal'}"
    write = optuna.Study.set_user_attr

    def stopped(self: optuna.Study, key: str, value: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(optuna.Study, "set_user_attr", stopped)
    with pytest.raises(KeyboardInterrupt):
        create_study(url, "s", IDENTITY)
    monkeypatch.setattr(optuna.Study, "set_user_attr", write)
    create_study(url, "s", IDENTITY)  # the search run again
    assert load_study(url, "s", None, None, IDENTITY).user_attrs["torchloom_search"] == IDENTITY


def test_a_stopped_trial_counts_until_its_retry_is_queued() -> None:
    """A stopped trial is failed, then its retry queued, one write later: a worker counting
    in between saw a free place and started a fresh trial, and the retry waited for ever
    (a grid point never tried, another tried twice)."""
    import optuna

    from torchloom.search.claims import queue_retry

    study = optuna.create_study()
    stopped = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    stopped.set_user_attr("retried", True)
    study.tell(stopped, state=optuna.trial.TrialState.FAIL)
    assert counted_trials(study) == 1  # its retry is not queued yet: its place is taken
    queue_retry(study, stopped)
    assert counted_trials(study) == 0  # the retry, when it runs, counts instead
    retry = study.ask()
    assert retry.user_attrs["retry_from"] == stopped.number and counted_trials(study) == 1
    # A retry queued by an older worker names only the chain's first trial.
    older = study.ask()
    older.set_user_attr("retried", True)
    study.tell(older, state=optuna.trial.TrialState.FAIL)
    study.enqueue_trial(older.params, user_attrs={"retry_of": older.number})
    assert counted_trials(study) == 1


def test_a_trials_heartbeats_go_on_after_a_failed_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Optuna's heartbeat thread ends at its first failed write (a database restart) while
    the trial trains on: 90 s later every worker failed the live trial, to run it twice."""
    import time

    import optuna
    from optuna.storages import RDBStorage

    from torchloom.search.claims import heartbeats

    storage = RDBStorage(f"sqlite:///{tmp_path / 'study.db'}", heartbeat_interval=1)
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    beats: list[int] = []
    record = storage.record_heartbeat

    def restarting(trial_id: int) -> None:
        beats.append(trial_id)
        if len(beats) == 2:
            raise ConnectionError("the database restarts")
        record(trial_id)

    monkeypatch.setattr(storage, "record_heartbeat", restarting)
    monkeypatch.setattr(storage, "get_heartbeat_interval", lambda: 0.02)
    with heartbeats(trial._trial_id, storage):
        time.sleep(0.3)
    assert len(beats) > 4


def test_a_retry_its_dead_process_never_queued_is_queued_by_the_next_worker() -> None:
    """A trial is failed, then its retry queued, two writes: a process killed between them
    (SIGKILL after a scheduler's SIGTERM) left a trial that counts until its retry exists,
    for ever. A worker queues it, once its process is known dead (never while that process
    is between the two writes)."""
    import os
    import socket
    import subprocess
    import sys

    import optuna

    from torchloom.search.claims import pid_space, reap_dead_trials, record_identity

    study = optuna.create_study()
    stopped = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    record_identity(stopped)
    stopped.set_user_attr("retried", True)
    study.tell(stopped, state=optuna.trial.TrialState.FAIL)
    assert reap_dead_trials(study) == [] and len(study.trials) == 1  # its process lives
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    attrs = {"pid": int(ended.stdout), "host": socket.gethostname(), "pid_space": pid_space()}
    failed = study.ask()
    for key, value in {**attrs, "pid_start": "1", "retried": True}.items():
        failed.set_user_attr(key, value)
    study.tell(failed, state=optuna.trial.TrialState.FAIL)
    assert counted_trials(study) == 2
    reap_dead_trials(study)
    (retry,) = [t for t in study.trials if t.state.name == "WAITING"]
    assert retry.user_attrs["retry_from"] == failed.number and counted_trials(study) == 1
    reap_dead_trials(study)  # once
    assert len([t for t in study.trials if t.state.name == "WAITING"]) == 1
    assert os.getpid() != int(ended.stdout)
