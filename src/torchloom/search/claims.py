"""Who runs each trial of a study, whether it still does, and the claiming of trials so that
the processes sharing a study start exactly --trials between them.

Dead trials. Each trial records its host, PID and the PID's start time (user attributes);
a trial left RUNNING by a process of this host that is gone (SIGKILL, a crash, a power cut)
is marked failed with the reason, and its parameters are queued once more (`retry_of`). A
dead trial whose retry died too stays failed. On an RDB storage, Optuna's heartbeats tell the
same of other machines' trials (its stale trials, failed and retried here the same way).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchloom.search.study import HEARTBEAT_SECONDS

if TYPE_CHECKING:
    import optuna

ASK_LOCK = ".ask.lock"


def process_start(pid: int) -> str:
    """The kernel's start time of a process (field 22 of /proc/PID/stat), which tells a PID
    that was reused from the process that had it; '' when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


@functools.cache  # a process's PID space does not change
def pid_space() -> str:
    """Which PIDs this process sees: the boot and the PID namespace (Linux). Containers that
    share a host's name (`--network host`, Kubernetes' hostNetwork) do not share its PIDs, nor
    does a cloned machine: a PID of theirs tells nothing here. '' where unknown."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def record_identity(trial: optuna.Trial) -> None:
    """Write which process runs `trial` (its PID space, PID, the PID's start time, host).
    Each attribute is a write of its own, and another machine's worker may read the trial
    between two of them (no lock covers both through a server): the host goes last, so a
    trial that names this host names its process whole, and `is_dead` judges only a whole
    record."""
    pid = os.getpid()
    trial.set_user_attr("pid_space", pid_space())
    trial.set_user_attr("pid_start", process_start(pid))
    trial.set_user_attr("pid", pid)
    trial.set_user_attr("host", socket.gethostname())


def is_dead(attrs: dict[str, Any]) -> bool | None:
    """Whether the process that runs a trial is gone: None when it ran on another host or
    in another PID namespace of this host's name and boot (a container), or its record is
    not whole yet (a PID without its start time read as a reused PID: a live worker's trial
    was failed while it trained), so this machine cannot tell."""
    if attrs.get("host") != socket.gethostname() or not isinstance(attrs.get("pid"), int):
        return None
    if "pid_start" not in attrs:
        return None
    here = pid_space()
    recorded = attrs.get("pid_space", here)  # a record older than it: this host's
    if recorded != here:
        # Another boot: every process of that one is gone (a power cut, then a resume).
        # The same boot, another PID namespace: a container's, which this one cannot see.
        boot_then, boot_now = recorded.partition(":")[0], here.partition(":")[0]
        return True if boot_then and boot_now and boot_then != boot_now else None
    pid = attrs["pid"]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    started = process_start(pid)
    return bool(started) and started != attrs.get("pid_start")


def reap_dead_trials(study: optuna.Study) -> list[int]:
    """Fail the RUNNING trials whose process on this host is gone and, on a database, those
    whose heartbeat stopped (any machine), each with its reason; queue their parameters again
    (once), and return their numbers. Call with the ask lock held."""
    from optuna.storages._heartbeat import is_heartbeat_enabled
    from optuna.trial import TrialState

    storage = study._storage
    stale: set[int] = set()
    if is_heartbeat_enabled(storage):  # RDB storages: other machines' dead trials too
        stale = set(storage._get_stale_trial_ids(study._study_id))  # type: ignore[attr-defined]
    reaped = []
    trials = study.get_trials(deepcopy=False)  # one read for the reaping and the lost retries
    for trial in (t for t in trials if t.state == TrialState.RUNNING):
        attrs = trial.user_attrs
        if is_dead(attrs):
            reason = f"its process {attrs['pid']} on {attrs['host']} died"
        elif trial._trial_id in stale:  # its process abandoned it or stopped (heartbeats)
            seconds = getattr(_rdb(storage), "grace_period", None) or 3 * HEARTBEAT_SECONDS
            reason = (
                f"no heartbeat from {attrs.get('host', '?')} for {seconds} s: "
                "its process or machine stopped"
            )
        else:
            continue
        # Attributes first: a finished trial takes none. Another machine reaping the same
        # trial at once writes the same ones, and only one of the two fails it.
        retry = "retry_of" not in attrs
        try:
            storage.set_trial_user_attr(trial._trial_id, "reason", reason)
            storage.set_trial_user_attr(trial._trial_id, "retried", retry)
            if not storage.set_trial_state_values(trial._trial_id, TrialState.FAIL):
                continue
        except Exception:  # finished meanwhile by its worker or another reaper: theirs stands
            continue
        if retry:
            queue_retry(study, trial)
        reaped.append(trial.number)
    _queue_lost_retries(study, trials)
    return reaped


def _queue_lost_retries(study: optuna.Study, trials: list[Any]) -> None:
    """Queue the retry of a trial failed to be retried whose process died before it queued
    the retry (two writes: SIGKILL after a scheduler's SIGTERM, say): the trial counts
    until its retry exists, and would count for ever. Only where its process is known dead,
    so never while that process is between the two writes; under the ask lock. `trials`:
    the study as read before the reaping (a trial it failed was RUNNING then: not lost)."""
    from optuna.trial import TrialState

    queued_again = retries_queued(trials)
    for trial in trials:
        lost = trial.state == TrialState.FAIL and trial.user_attrs.get("retried")
        if lost and not queued_again(trial) and is_dead(trial.user_attrs):
            queue_retry(study, trial)


def queue_retry(study: optuna.Study, trial: Any) -> None:
    """Queue a failed trial's parameters once more: `retry_of` names the chain's first trial
    (trials.csv), `retry_from` this one (`counted_trials`)."""
    origin = trial.user_attrs.get("retry_of", trial.number)
    study.enqueue_trial(trial.params, user_attrs={"retry_of": origin, "retry_from": trial.number})


def retries_queued(trials: list[Any]) -> Callable[[Any], bool]:
    """Whether a retry of a trial is queued (or ran), among `trials`."""
    retried_from = {t.user_attrs["retry_from"] for t in trials if "retry_from" in t.user_attrs}
    # Retries queued before `retry_from` was written name only their chain's first trial.
    older: dict[Any, list[int]] = {}
    for t in trials:
        if "retry_of" in t.user_attrs and "retry_from" not in t.user_attrs:
            older.setdefault(t.user_attrs["retry_of"], []).append(t.number)

    def queued_again(trial: Any) -> bool:
        if trial.number in retried_from:
            return True
        origin = trial.user_attrs.get("retry_of", trial.number)
        return any(number > trial.number for number in older.get(origin, ()))

    return queued_again


@contextlib.contextmanager
def heartbeats(trial_id: int, storage: Any) -> Iterator[None]:
    """Optuna's heartbeats of a running trial (databases), kept up through failed writes:
    Optuna's own thread ends at its first (a database restart) while the trial trains on,
    which every worker then failed as stopped, to run it twice."""
    from optuna.storages._heartbeat import is_heartbeat_enabled

    if not is_heartbeat_enabled(storage):
        yield
        return
    interval = storage.get_heartbeat_interval()
    stop = threading.Event()

    def beat() -> None:
        while True:
            with contextlib.suppress(Exception):  # the next beat tries again
                storage.record_heartbeat(trial_id)
            if stop.wait(interval):
                return

    thread = threading.Thread(target=beat, name="torchloom-trial-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)  # a beat stuck on an unreachable database is left behind


def counted_trials(study: optuna.Study) -> int:
    """Trials that count toward --trials: finished or running, less the failed ones whose
    parameters were queued again (their retry counts instead). A failed trial counts until
    its retry is queued, a write after its failure: another worker counting in between
    started a fresh trial, and the retry then waited for ever (a grid point never tried)."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    queued_again = retries_queued(trials)
    count = 0
    for trial in trials:
        if trial.state == TrialState.WAITING:
            continue
        failed = trial.state == TrialState.FAIL and trial.user_attrs.get("retried")
        if failed and queued_again(trial):
            continue
        count += 1
    return count


@contextlib.contextmanager
def ask_lock(search_dir: Path, url: str, study: optuna.Study) -> Iterator[bool]:
    """Held while a worker counts the trials and asks for one, so that the workers sharing a
    study start exactly --trials trials between them. A file lock in the search folder covers
    the workers of `--workers K`; a journal elsewhere is locked beside its file too, and a
    PostgreSQL study with an advisory lock held in a transaction of its own, which the server
    drops when the process or its connection dies. Yields whether the lock covers every
    process that may share the study; where it does not (another database, or one SQLite
    file shared by several search folders), the caller checks after asking (`claim_trial`)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_file_lock(search_dir / ASK_LOCK))
        exact = False
        if url.startswith("journal:"):
            journal = Path(url[len("journal:") :])
            if journal.parent.resolve() != Path(search_dir).resolve():
                # Not `<journal>.lock`: Optuna's own lock of the journal file is that name.
                stack.enter_context(_file_lock(journal.with_name(journal.name + ASK_LOCK)))
            exact = True
        elif _dialect(study._storage) == "postgresql":
            stack.enter_context(_advisory_lock(_rdb(study._storage), study._study_id))
            exact = True
        yield exact


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _rdb(storage: Any) -> Any:
    """The RDBStorage behind a study's storage (Optuna wraps it in its cache), or None."""
    from optuna.storages import RDBStorage

    storage = getattr(storage, "_backend", storage)
    return storage if isinstance(storage, RDBStorage) else None


def _dialect(storage: Any) -> str | None:
    rdb = _rdb(storage)
    return None if rdb is None else str(rdb.engine.dialect.name)


# The advisory lock's first key: "loom" in ASCII; the second is the study's id.
ADVISORY_NAMESPACE = 0x6C6F6F6D


@contextlib.contextmanager
def _advisory_lock(storage: Any, study_id: int) -> Iterator[None]:
    """pg_advisory_xact_lock(namespace, study): released when the transaction ends, and by
    the server when this process dies (its connection closes)."""
    from sqlalchemy import text

    with storage.engine.connect() as connection, connection.begin():
        connection.execute(
            text("SELECT pg_advisory_xact_lock(:namespace, :study)"),
            {"namespace": ADVISORY_NAMESPACE, "study": int(study_id)},
        )
        yield


def claim_trial(study: optuna.Study, budget: int, exact: bool) -> optuna.Trial | None:
    """Ask the study for a trial when fewer than `budget` count, with the ask lock held; None
    when the study has its trials. Where the lock does not cover every process (`exact`
    false), another machine may have asked at the same moment: a trial over the budget is
    handed back to the queue (WAITING, nothing sampled yet) and None returned, so the caller
    counts again; when both hand theirs back, both ask again."""
    from optuna.trial import TrialState

    if counted_trials(study) >= budget:
        return None
    trial = study.ask()
    if not exact and counted_trials(study) > budget:
        study._storage.set_trial_state_values(trial._trial_id, TrialState.WAITING)
        return None
    return trial
