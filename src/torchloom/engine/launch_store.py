"""Node 0 keeps the rendezvous's store open until the other machines have left it.

The elastic agent of node 0 hosts the TCP store every agent talks to, and closes it as soon as
its own launch returns. The agents of the other machines may still be using it then: waiting
at the exit barrier for the notice node 0 was about to send, or on their rendezvous's
keep-alive. They see the connection reset and print torch's C++ stack traces (and "Error
waiting on exit barrier") at the end of a run that succeeded, one run in three on a loaded
machine. So node 0 starts the store's server itself, before its agent does (a store of the
same port in the same process shares one server: `multi_tenant`), and keeps it until every
other machine has said, once its own launch has returned, that it is done with it.
"""

from __future__ import annotations

import socket
import sys
import time
from datetime import timedelta
from typing import Any

# How long node 0 waits for the other machines after a run that succeeded there: they leave
# at the same exit barrier, so this only bounds the wait for one that died after it.
LEAVE_TIMEOUT = 30.0
SAY_WAITING_AFTER = 2.0  # seconds: then node 0 says what it waits for


def host_and_port(endpoint: str) -> tuple[str, int]:
    """HOST:PORT as the socket calls take it: an IPv6 address loses the brackets it is
    written in ([::1]:29400)."""
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


class StoreKeeper:
    """For one launch at `endpoint` of `nnodes` machines, this one `node_rank`: on node 0 of
    several, the store is served from now (before the agent starts) until `succeeded()` has
    seen the other machines leave it (at most LEAVE_TIMEOUT s; a launch that failed waits for
    nobody: the keeper is dropped with its store). On the others, `succeeded()` says so to
    node 0 (where a launch failed, so did node 0's). `run_id` keeps the count to this launch
    (a late machine of an earlier run on the same port counts for nothing). `close()` ends
    the store of a launch that failed (its exception, kept by a caller, would keep it)."""

    def __init__(self, endpoint: str, nnodes: int, node_rank: int, run_id: str) -> None:
        self.endpoint, self.others = endpoint, nnodes - 1
        self.host = node_rank == 0
        self.key = f"torchloom/{run_id}/nodes_left"
        self._store = _store(endpoint, server=True) if self.others and self.host else None

    def succeeded(self) -> None:
        if self._store is not None:
            _wait_for_the_others(self._store, self.key, self.others)
        elif self.others and not self.host:
            _say_left(self.endpoint, self.key)
        self.close()

    def close(self) -> None:
        self._store = None


def _store(endpoint: str, server: bool, timeout: float = 60.0) -> Any:
    from torch.distributed import TCPStore

    host, port = host_and_port(endpoint)
    # The same options as the rendezvous's own store, whose server this one then is.
    return TCPStore(
        host,
        port,
        is_master=server,
        multi_tenant=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=timeout),
    )


def _wait_for_the_others(store: Any, key: str, others: int) -> None:
    started = time.monotonic()
    said = False
    try:
        while int(store.add(key, 0)) < others and time.monotonic() < started + LEAVE_TIMEOUT:
            if not said and time.monotonic() > started + SAY_WAITING_AFTER:
                print(
                    f"waiting for the other machines to leave the rendezvous (at most "
                    f"{LEAVE_TIMEOUT:.0f} s; Ctrl-C stops waiting)",
                    file=sys.stderr,
                    flush=True,
                )
                said = True
            time.sleep(0.05)
    except KeyboardInterrupt:  # the run has ended: a Ctrl-C now only stops the waiting
        pass
    except Exception:  # the store failing now: nothing left to keep it for
        pass


def _say_left(endpoint: str, key: str) -> None:
    """Best effort: node 0 waits LEAVE_TIMEOUT s at most for a machine that cannot say so.
    Node 0 gone (it stopped waiting), there is nobody to tell: a plain connection asks first,
    since torch's store client prints a C++ stack trace at every failed try. A Ctrl-C now
    only stops the telling: the run has ended, and well."""
    try:
        socket.create_connection(host_and_port(endpoint), timeout=1.0).close()
        _store(endpoint, server=False, timeout=5.0).add(key, 1)
    except (Exception, KeyboardInterrupt):
        pass
