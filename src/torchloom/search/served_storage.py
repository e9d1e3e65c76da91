"""The storage `loom search-server` serves (server.py): Optuna's cached storage in front of
the database, as Optuna's proxy server builds it, with the trials' state changes made one at
a time when the database is SQLite.

Why. A worker takes a queued trial (a retry, a grid point, `enqueue_trial`) in Optuna's
`Study._pop_waiting_trial_id`: it lists the WAITING trials and moves the first to RUNNING
with `set_trial_state_values`, which returns False when the trial is no longer WAITING.
`RDBStorage` makes that check-and-set atomic by reading the row `SELECT ... FOR UPDATE`.
SQLite has no row lock: SQLAlchemy drops FOR UPDATE for it, and Python's sqlite3 begins the
transaction only at the UPDATE, so two of the server's gRPC threads can both read WAITING and
both write RUNNING, and both workers train the same trial (tests/search/test_search_grpc.py:
5 to 16 of 120 queued trials handed out twice in each of 10 tries). The server is the
database's only user, so one lock in it makes each change read what the one before committed.
PostgreSQL and MySQL lock the row themselves: there the server keeps its threads' concurrency.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from optuna.storages import BaseStorage, RDBStorage
from optuna.storages._cached_storage import _CachedStorage
from optuna.trial import TrialState


class _OneStateChangeAtATime(_CachedStorage):
    """_CachedStorage whose `set_trial_state_values` (queued to running, running to finished
    or handed back) runs under one lock: the second of two changes of a trial sees the first."""

    def __init__(self, backend: RDBStorage) -> None:
        super().__init__(backend)
        self._state_change = threading.Lock()

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None = None
    ) -> bool:
        with self._state_change:
            return super().set_trial_state_values(trial_id, state, values)


def served_storage(database: BaseStorage) -> BaseStorage:
    """What the server serves for `database` (an RDBStorage, study.open_storage)."""
    if isinstance(database, RDBStorage) and database.engine.dialect.name == "sqlite":
        return _OneStateChangeAtATime(database)
    from optuna.storages import get_storage

    return get_storage(database)
