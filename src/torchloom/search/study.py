"""The Optuna study of a search: its storage, created once and loaded by every worker, and
how a worker finds it; who runs its trials and the claiming of them under --trials are in
claims.py.

Storage: a journal file in the search folder by default (JournalStorage + JournalFileBackend:
the maintainers' choice for several processes on one machine), or any SQLAlchemy URL
(`postgresql://...`) for several machines, with Optuna's heartbeats. The study is created by
one process and loaded by the others: several `create_study(load_if_exists=True)` on a fresh
database race (optuna#1092).
"""

from __future__ import annotations

import hashlib
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, urlsplit

from torchloom.errors import ConfigError, LoomError, shown_briefly
from torchloom.search.settings import PRUNERS, SearchSettings, component_class
from torchloom.search.space import SearchSpace
from torchloom.search.storage_urls import (
    GRPC,
    STORAGE_FORMS,
    grpc_address,
    has_password,
    hide_password,
    hide_passwords_in,
    with_installed_driver,
)
from torchloom.signals import stops_held

if TYPE_CHECKING:
    import optuna

JOURNAL = "study.journal"
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
    # Each trial is asked for, not run by Study.optimize, and the worker runs its heartbeat
    # thread itself (worker.work): Optuna's warning about that, at every trial, says nothing.
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")


def open_storage(
    url: str, given_as: str = "--storage", accepted: str = STORAGE_FORMS
) -> optuna.storages.BaseStorage:
    """`journal:PATH` or an SQLAlchemy URL; an unreachable database is a StorageUnreachable
    naming the host, not a SQLAlchemy traceback; `given_as`: how the user gave the URL;
    `accepted`: the forms it may take, named when it is none of them."""
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    quiet_optuna()
    if url.startswith("journal:"):
        path = url[len("journal:") :]
        try:
            return JournalStorage(JournalFileBackend(path))
        except OSError as error:
            raise StorageUnreachable.at(
                given_as,
                url,
                f"cannot open the journal file: {error.strerror or error}",
                "check that its folder exists and this user may write there",
            ) from error
        except Exception as error:  # a received file: whatever its replay raises
            # Optuna replays the whole journal as it opens it and trusts every line: a
            # damaged or foreign file raised JSONDecodeError, AssertionError, KeyError, ...
            raise StorageUnreachable.at(
                path,
                "journal",
                f"cannot be replayed by Optuna {optuna_version()} (damaged, written by another "
                f"Optuna version, or no Optuna journal): {shown_briefly(error, 120)}",
                "open it with the Optuna version that wrote it, or restore the search folder's "
                "study.journal from a copy; --storage journal:FILE names an Optuna journal or "
                "a new file",
            ) from error
    if url.startswith(GRPC):
        return _grpc_proxy(url)
    from optuna.storages import RDBStorage
    from sqlalchemy.exc import ArgumentError

    given, shown = url, hide_password(url)
    url = with_installed_driver(url)
    parts = urlsplit(url)
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
                given_as,
                shown,
                f"needs a driver: {error}",
                "pip install 'torchloom[search]' (psycopg2-binary for PostgreSQL)",
            ) from error
        except ArgumentError as error:  # no dialect of that name (foo://, file://), no URL
            raise StorageUnreachable.at(
                given_as, shown, "is not a database URL", f"give {accepted}"
            ) from error
        except Exception as error:  # sqlalchemy.exc.OperationalError and friends
            last = error
            # The loser of two processes creating the tables at once: PostgreSQL says the
            # table "already exists", SQLite that alembic_version's row is taken.
            if not any(text in str(error) for text in _CREATED_BY_ANOTHER):
                break
            time.sleep(0.5 * (attempt + 1))
    # A driver may quote the URL it was given (SQLAlchemy's parse errors do).
    message = hide_passwords_in(str(last).strip().splitlines()[0] if last else "?", given)
    if parts.scheme.startswith("sqlite"):
        raise StorageUnreachable.at(
            given_as,
            shown,
            f"cannot open the SQLite database: {message}",
            "check that its folder exists and this user may write there",
        ) from last
    hint = "check that the server runs and accepts this user from this machine"
    if not has_password(given):
        # A search folder keeps no password (storage_urls.py): a resume must be given it.
        hint += (
            "; a password it asks for goes in the URL, or in PGPASSWORD or ~/.pgpass for "
            "PostgreSQL (a search folder keeps none: `loom search --resume DIR --storage URL` "
            "gives it again)"
        )
    raise StorageUnreachable.at(
        given_as, shown, f"cannot open the database on {_where(parts)}: {message}", hint
    ) from last


def _where(parts: SplitResult) -> str:
    """HOST:PORT of a database URL, as a message names it."""
    try:
        port = parts.port
    except ValueError:  # a port that is no number: SQLAlchemy's message says so
        port = None
    return f"{parts.hostname or 'localhost'}:{port or 'default port'}"


_CREATED_BY_ANOTHER = ("already exists", "UNIQUE constraint failed: alembic_version")


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


def make_sampler(
    settings: SearchSettings,
    space: SearchSpace | None,
    seed: int | None,
    draw: int | None = None,
) -> Any:
    """The search's sampler. `seed` (the search's, from --seed or the sampler's settings) with
    `draw`, the trial's place among the trials that draw values (draw_number): the sampler
    that draws that trial, seeded by both, so that a seeded search draws a trial's values
    from its place alone, whichever worker, session or machine asks. Asking under the ask lock
    gives every trial its own place, so two machines that start at the same moment with the
    same seed draw different values."""
    import optuna

    spec = dict(settings.sampler)
    cls = component_class("sampler", spec.pop("type"))
    if cls is optuna.samplers.GridSampler and space is not None:
        spec.setdefault("search_space", {p.path: p.grid() for p in space.parameters.values()})
    if seed is not None and cls is not optuna.samplers.GridSampler:
        # QMC takes the i-th point of one scrambled sequence, i counted in the study: every
        # process must scramble alike, with the search's own seed.
        if draw is not None and cls is not optuna.samplers.QMCSampler:
            seed = trial_seed(seed, draw)
        spec["seed"] = seed
    try:
        return cls(**spec)
    except ImportError as error:  # cmaes, and scipy for qmc
        raise ConfigError.at(
            "search setting 'sampler'", cls.__name__, f"needs a package: {error}"
        ) from error


def draw_number(trials: Sequence[Any], number: int | None = None) -> int:
    """The trial's place among the trials that draw values (the seed's second half, with
    make_sampler): the trials before it (before trial `number`; all of them for the next
    trial asked) less the re-runs of stopped trials (`retry_of`), which take the values they
    had and draw nothing. So a search stopped and resumed draws, for its k-th drawing trial,
    what the search left alone drew for its k-th (numbered one more after each re-run)."""
    return sum(
        1
        for t in trials
        if (number is None or t.number < number) and "retry_of" not in t.user_attrs
    )


def trial_seed(seed: int, draw: int) -> int:
    """A seed of its own for each trial of a seeded search; mixed, not added, so that seed
    S's trial 1 is not seed S+1's trial 0. Under 2**32: NumPy's seeds."""
    digest = hashlib.sha256(f"{seed}:{draw}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def make_pruner(settings: SearchSettings, epochs: int | None = None) -> Any:
    """The search's pruner; `epochs`: how many epochs every trial trains, when the search
    knows (worker.trial_epochs)."""
    import optuna

    spec = dict(settings.pruner)
    cls = getattr(optuna.pruners, PRUNERS[spec.pop("type")])
    if cls is optuna.pruners.HyperbandPruner and epochs is not None:
        # Optuna's max_resource="auto" learns it from the first trial to finish and prunes
        # nothing until one has: every trial that K workers (or machines) start before then
        # trains to the end unjudged. A search knows the epochs its trials train.
        spec.setdefault("max_resource", epochs)
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
        # A stop between the creation and the identity's write would leave a study every
        # later search of that name refuses (no identity): held over both, and undone if
        # the write fails.
        with stops_held():
            created = optuna.create_study(storage=storage, study_name=name, direction=wanted)
            try:
                created.set_user_attr(IDENTITY, dict(identity))
            except BaseException:
                optuna.delete_study(study_name=name, storage=storage)
                raise
    except optuna.exceptions.DuplicatedStudyError:
        loaded = optuna.load_study(storage=storage, study_name=name)
        # Another machine may have created it a moment ago and not yet written its identity.
        for attempt in range(5):
            if IDENTITY in loaded.user_attrs:
                break
            time.sleep(0.2 * (attempt + 1))
            loaded = optuna.load_study(storage=storage, study_name=name)
        check_identity(url, name, loaded.user_attrs.get(IDENTITY), identity)


def check_identity(url: str, name: str, found: Any, wanted: Mapping[str, str] | None) -> None:
    """Refuse a study whose identity is not the search's (None: an older search folder that
    recorded none, nothing to compare)."""
    if wanted is None:
        return
    if not isinstance(found, Mapping):
        differs = (
            "has no search identity: it was not made by a torchloom search, or its storage "
            "lost the record (a journal cut short, say)"
        )
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
        hide_password(url),
        f"study '{name}'",
        differs,
        "give a new search a study of its own (--study NAME); a search folder whose own "
        "study lost its record needs its storage restored from a copy",
    )


def _sqlite_file(url: str) -> Path | None:
    """The file of a `sqlite:///PATH` URL (None for another storage or an in-memory one)."""
    head, _, path = url.partition(":///")
    if head.split("+")[0] != "sqlite" or not path or path.startswith(":memory:"):
        return None
    return Path(path.split("?")[0])


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
    database = _sqlite_file(url)
    if database is not None and not database.is_file():  # opening one would make it
        raise ConfigError.at(
            hide_password(url),
            f"study '{name}'",
            "cannot be loaded: the SQLite file does not exist",
            "give the database the study was created in",
        )
    storage = open_storage(url)
    try:
        study = optuna.load_study(storage=storage, study_name=name, sampler=sampler, pruner=pruner)
    except KeyError:
        raise ConfigError.at(
            hide_password(url),
            f"study '{name}'",
            "is not in this storage (deleted or renamed?)",
            "the study a search folder records (search.json) must still exist",
        ) from None
    check_identity(url, name, study.user_attrs.get(IDENTITY), identity)
    return study


def optuna_version() -> str:
    from importlib.metadata import version

    return version("optuna")
