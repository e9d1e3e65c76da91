"""The Optuna study of a search: its storage, created once and loaded by every worker, and
the bookkeeping Optuna leaves to us on a journal.

Storage: a journal file in the search folder by default (JournalStorage + JournalFileBackend:
the maintainers' choice for several processes on one machine), or any SQLAlchemy URL
(`postgresql://...`) for several machines, with Optuna's heartbeats. The study is created by
one process and loaded by the others: several `create_study(load_if_exists=True)` on a fresh
database race (optuna#1092).

Dead trials. Each trial records its host, PID and the PID's start time (user attributes);
a trial left RUNNING by a process of this host that is gone (SIGKILL, a crash, a power cut)
is marked failed with the reason, and its parameters are queued once more (`retry_of`). A
dead trial whose retry died too stays failed. On an RDB storage, Optuna's heartbeats tell the
same of other machines' trials (its stale trials, failed and retried here the same way).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from torchloom.errors import ConfigError, LoomError
from torchloom.search.settings import PRUNERS, SearchSettings, component_class
from torchloom.search.space import SearchSpace

if TYPE_CHECKING:
    import optuna

JOURNAL = "study.journal"
ASK_LOCK = ".ask.lock"
HEARTBEAT_SECONDS = 30
# The user attribute of a study that says which search made it: {monitor, direction, digest}.
IDENTITY = "torchloom_search"


class StorageUnreachable(LoomError):
    headline = "search storage error"


def journal_url() -> str:
    """The default storage, relative to the search folder (SearchRecord.storage_url), so a
    search folder may be moved or copied and still resumed."""
    return f"journal:{JOURNAL}"


def quiet_optuna() -> None:
    """Optuna logs every study creation and trial at INFO; the search prints its own lines."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # Heartbeats and their retry callback are "experimental" since Optuna 2.8/2.9: said once
    # here (docs/search.md), not at every trial.
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """`journal:PATH` or an SQLAlchemy URL; an unreachable database is a StorageUnreachable
    naming the host, not a SQLAlchemy traceback."""
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    quiet_optuna()
    if url.startswith("journal:"):
        return JournalStorage(JournalFileBackend(url[len("journal:") :]))
    if url.startswith(GRPC):
        return _grpc_proxy(url)
    from optuna.storages import RDBStorage

    parts = urlsplit(url)
    where = f"{parts.hostname or 'localhost'}:{parts.port or 'default port'}"
    last: Exception | None = None
    for attempt in range(3):  # several machines creating the tables at once: one wins
        try:
            return RDBStorage(
                url,
                heartbeat_interval=HEARTBEAT_SECONDS,
                grace_period=3 * HEARTBEAT_SECONDS,
            )
        except ImportError as error:
            raise StorageUnreachable.at(
                "--storage",
                _hide_password(url),
                f"needs a driver: {error}",
                "pip install 'torchloom[search]' (psycopg2-binary for PostgreSQL)",
            ) from error
        except Exception as error:  # sqlalchemy.exc.OperationalError and friends
            last = error
            if "already exists" not in str(error):
                break
            time.sleep(0.5 * (attempt + 1))
    message = str(last).strip().splitlines()[0] if last else "?"
    raise StorageUnreachable.at(
        "--storage",
        _hide_password(url),
        f"cannot open the database on {where}: {message}",
        "check that the server runs and accepts this user from this machine",
    ) from last


GRPC = "grpc://"
GRPC_PORT = 13000  # Optuna's default


def grpc_address(url: str) -> tuple[str, int]:
    """(host, port) of `grpc://HOST[:PORT]`."""
    parts = urlsplit(url)
    try:
        port = parts.port or GRPC_PORT
    except ValueError as error:
        raise ConfigError.at("--storage", url, f"has no valid port: {error}") from error
    if not parts.hostname or parts.path not in ("", "/"):
        raise ConfigError.at(
            "--storage", url, "must be grpc://HOST:PORT", "e.g. grpc://db.lab:13000"
        )
    return parts.hostname, port


def _grpc_proxy(url: str) -> optuna.storages.BaseStorage:
    """Optuna's GrpcStorageProxy to a `loom search-server` (or Optuna's own proxy server),
    checked to answer: a server that is not there is named plainly."""
    host, port = grpc_address(url)
    try:
        import grpc
        from optuna.storages import GrpcStorageProxy

        proxy = GrpcStorageProxy(host=host, port=port)
        proxy.get_all_studies()
    except ImportError as error:
        raise StorageUnreachable.at(
            "--storage", url, f"needs gRPC: {error}", "pip install 'torchloom[search]'"
        ) from error
    except grpc.RpcError as error:
        details = error.details() if hasattr(error, "details") else str(error)
        raise StorageUnreachable.at(
            "--storage",
            url,
            f"cannot reach the search server on {host}:{port}: {details}",
            "start one there: loom search-server DATABASE_URL --host HOST --port PORT",
        ) from error
    return proxy


def _hide_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        return url.replace(f":{parts.password}@", ":***@")
    return url


def make_sampler(settings: SearchSettings, space: SearchSpace | None, seed: int | None) -> Any:
    import optuna

    spec = dict(settings.sampler)
    cls = component_class("sampler", spec.pop("type"))
    if cls is optuna.samplers.GridSampler and space is not None:
        spec.setdefault("search_space", {p.path: p.grid() for p in space.parameters.values()})
    if seed is not None and "seed" not in spec and cls is not optuna.samplers.GridSampler:
        spec["seed"] = seed
    try:
        return cls(**spec)
    except ImportError as error:  # cmaes, and scipy for qmc
        raise ConfigError.at(
            "search setting 'sampler'", cls.__name__, f"needs a package: {error}"
        ) from error


def make_pruner(settings: SearchSettings) -> Any:
    import optuna

    spec = dict(settings.pruner)
    cls = getattr(optuna.pruners, PRUNERS[spec.pop("type")])
    if cls is optuna.pruners.SuccessiveHalvingPruner:
        # Optuna's default (bootstrap_count=0) is kept explicit: a bootstrap_count of k
        # prunes the first k trials at every rung.
        spec.setdefault("bootstrap_count", 0)
    return cls(**spec)


def config_digest(*texts: str) -> str:
    """A short digest of what a search is (its config, its space): two searches with the same
    digest search the same thing and may share a study."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8") + b"\0")
    return digest.hexdigest()[:16]


def create_study(url: str, name: str, identity: Mapping[str, str]) -> None:
    """Create the study with the search's identity ({monitor, direction, digest}) in its user
    attributes, or, when another process (another machine) already created it, check that it
    is the same search's; only this process creates, so no two creations race on a fresh
    file. A study of another search is refused: joining it would mix unrelated trials."""
    import optuna

    storage = open_storage(url)
    wanted = optuna.study.StudyDirection.MAXIMIZE
    if identity["direction"] != "maximize":
        wanted = optuna.study.StudyDirection.MINIMIZE
    try:
        created = optuna.create_study(storage=storage, study_name=name, direction=wanted)
    except optuna.exceptions.DuplicatedStudyError:
        loaded = optuna.load_study(storage=storage, study_name=name)
        # Another machine may have created it a moment ago and not yet written its identity.
        for attempt in range(5):
            if IDENTITY in loaded.user_attrs:
                break
            time.sleep(0.2 * (attempt + 1))
            loaded = optuna.load_study(storage=storage, study_name=name)
        check_identity(url, name, loaded.user_attrs.get(IDENTITY), identity)
    else:
        created.set_user_attr(IDENTITY, dict(identity))


def check_identity(url: str, name: str, found: Any, wanted: Mapping[str, str] | None) -> None:
    """Refuse a study whose identity is not the search's (None: an older search folder that
    recorded none, nothing to compare)."""
    if wanted is None:
        return
    if not isinstance(found, Mapping):
        differs = "was not made by a torchloom search (it has no search identity)"
    else:
        names = {"digest": "config and space digest"}
        changed = [
            f"its {names.get(key, key)} is {found.get(key)}, this search's is {value}"
            for key, value in wanted.items()
            if found.get(key) != value
        ]
        if not changed:
            return
        differs = "belongs to another search: " + "; ".join(changed)
    raise ConfigError.at(
        _hide_password(url),
        f"study '{name}'",
        differs,
        "give this search a study of its own: --study NAME",
    )


def load_study(
    url: str, name: str, sampler: Any, pruner: Any, identity: Mapping[str, str] | None = None
) -> optuna.Study:
    """The study `name` of the storage `url`, checked to be the search's (`identity`, see
    create_study); a missing journal or study is a ConfigError, and a missing journal file is
    not created."""
    import optuna

    if url.startswith("journal:") and not Path(url[len("journal:") :]).is_file():
        raise ConfigError.at(
            url,
            f"study '{name}'",
            "cannot be loaded: the journal file does not exist",
            "a search folder keeps its study in study.journal; was it deleted or moved?",
        )
    storage = open_storage(url)
    try:
        study = optuna.load_study(storage=storage, study_name=name, sampler=sampler, pruner=pruner)
    except KeyError:
        raise ConfigError.at(
            _hide_password(url),
            f"study '{name}'",
            "is not in this storage (deleted or renamed?)",
            "the study a search folder records (search.json) must still exist",
        ) from None
    check_identity(url, name, study.user_attrs.get(IDENTITY), identity)
    return study


# ---- who runs a trial, and whether it still does ---------------------------------------------
def process_start(pid: int) -> str:
    """The kernel's start time of a process (field 22 of /proc/PID/stat), which tells a PID
    that was reused from the process that had it; '' when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def identity() -> dict[str, Any]:
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "pid_start": process_start(pid)}


def is_dead(attrs: dict[str, Any]) -> bool | None:
    """Whether the process that runs a trial is gone: None when it ran on another host (or
    recorded nothing), so this machine cannot tell."""
    if attrs.get("host") != socket.gethostname() or not isinstance(attrs.get("pid"), int):
        return None
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
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        attrs = trial.user_attrs
        if is_dead(attrs):
            reason = f"its process {attrs['pid']} on {attrs['host']} died"
        elif trial._trial_id in stale:
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
        storage.set_trial_user_attr(trial._trial_id, "reason", reason)
        storage.set_trial_user_attr(trial._trial_id, "retried", retry)
        try:
            if not storage.set_trial_state_values(trial._trial_id, TrialState.FAIL):
                continue
        except Exception:  # finished meanwhile by someone else: nothing to do
            continue
        if retry:
            study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
        reaped.append(trial.number)
    return reaped


def counted_trials(study: optuna.Study) -> int:
    """Trials that count toward --trials: finished or running, less the dead ones whose
    parameters were queued again (their retry counts instead)."""
    from optuna.trial import TrialState

    count = 0
    for trial in study.get_trials(deepcopy=False):
        if trial.state == TrialState.WAITING:
            continue
        if trial.state == TrialState.FAIL and trial.user_attrs.get("retried"):
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
