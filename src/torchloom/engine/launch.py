"""The launcher side of several processes: `loom train --nproc N` (`--nnodes`, `--gpu`) starts
its workers through torch.distributed's elastic launcher (engine/distributed.py: theirs).

The launcher and its workers on this machine share a `Handoff` folder: each worker's pid (the
launcher passes signals on to it), rank 0's run folder (an elastic restart continues it), and
what ended a worker (a user error in its own words, or an internal failure with its
traceback), so that the launcher can say which rank failed first and why, and write it into
the run folder's log, whatever the other ranks died of after it.

Signals: each launched worker leaves the launcher's process group (`Handoff.start_worker`), so
that a terminal's Ctrl-C reaches it once, through the launcher, as it reaches a single
process; the elastic agent runs in a thread of its own, where it installs no signal handlers
of its own (its handlers would stop the workers with SIGTERM and wait 30 s for them).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchloom.config.interpolation import ascii_digits
from torchloom.config_model import usable_cpus
from torchloom.engine.launch_signals import passed_on, stop_when_gone
from torchloom.engine.launch_store import StoreKeeper, host_and_port
from torchloom.errors import ConfigError, LoomError, first_line
from torchloom.signals import set_parent_death_signal


@dataclass(frozen=True)
class LaunchOptions:
    nproc: int = 1
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # HOST:PORT of the rendezvous; a free local port if None
    max_restarts: int = 0
    rdzv_timeout: int = 120  # seconds to wait for every node

    @property
    def several(self) -> bool:
        return self.nproc > 1 or self.nnodes > 1


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def check_launch(options: LaunchOptions, gpus: int | None = None) -> None:
    """Refuse what cannot start, each flag by its name: counts below their least, more
    processes than cores or GPUs (`gpus`: the visible GPUs, when the processes train on
    them), a bad endpoint."""
    least = {
        "--nproc": (options.nproc, 1),
        "--nnodes": (options.nnodes, 1),
        "--max-restarts": (options.max_restarts, 0),
        "--rdzv-timeout": (options.rdzv_timeout, 1),
    }
    for flag, (value, minimum) in least.items():
        if value < minimum:
            raise ConfigError.at("command line", f"{flag} {value}", f"must be {minimum} or more")
    available = gpus if gpus is not None else usable_cpus()
    if options.nproc > available:
        what = "GPUs" if gpus is not None else "CPU cores this process may use"
        raise ConfigError.at(
            "command line",
            f"--nproc {options.nproc}",
            f"is more than the {available} {what} of this machine",
            f"use --nproc {available} or fewer"
            + (
                " (each process trains on a GPU of its own; --device cpu trains on the CPU)"
                if gpus is not None
                else ""
            ),
        )
    if not 0 <= options.node_rank < options.nnodes:
        raise ConfigError.at(
            "command line",
            f"--node-rank {options.node_rank}",
            f"must be in 0..{options.nnodes - 1}",
        )
    if options.nnodes > 1 and not options.rdzv_endpoint:
        raise ConfigError.at(
            "command line",
            "--rdzv-endpoint",
            "is needed to join several machines",
            "give HOST:PORT of node 0, the same on every machine",
        )
    if options.rdzv_endpoint and not _endpoint_ok(options.rdzv_endpoint):
        raise ConfigError.at(
            "command line",
            f"--rdzv-endpoint {options.rdzv_endpoint}",
            "is not HOST:PORT",
            "write an IPv6 address in brackets: [::1]:29400",
        )


def _endpoint_ok(text: str) -> bool:
    host, _, port = text.rpartition(":")
    ipv6_bare = ":" in host and not (host.startswith("[") and host.endswith("]"))
    return bool(host.strip("[]")) and not ipv6_bare and ascii_digits(port) and 0 < int(port) < 65536


# ---- what the launcher and its workers share -----------------------------------------------
@dataclass(frozen=True)
class Failure:
    rank: int
    reason: str  # one line
    user_error: bool  # a LoomError: its whole message is `text`
    text: str  # the user error's message, or the traceback of an internal one
    at: float  # time.time() when the worker recorded it
    attempt: int  # 0, or the elastic restart it happened in


class Handoff:
    """A folder the launcher shares with its workers on this machine (a temporary one, which
    the launcher removes)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    # -- written by the workers
    def start_worker(self, rank: int, launcher: int) -> None:
        """Called first in a launched worker: out of the launcher's process group (see the
        module's docstring), stopped as by Ctrl-C if the launcher (pid `launcher`) dies, and
        its pid where the launcher finds it."""
        os.setpgid(0, 0)
        # Undo the parent-death signal torch's spawn asks Linux for (SIGINT): Linux sends it
        # once per thread of the launcher that exits (the agent's, then the main one), and a
        # second signal stops a run at once, before it saves. `stop_when_gone` sends one.
        set_parent_death_signal(0)
        threading.Thread(
            target=stop_when_gone, args=(launcher,), name="torchloom-launcher-watch", daemon=True
        ).start()
        self._write(f"pid-{rank:04d}", str(os.getpid()))

    def set_run_dir(self, run_dir: Path) -> None:
        self._write("run_dir", str(run_dir))

    def record_failure(self, rank: int, error: BaseException, reason: str) -> None:
        """What ended this worker, before it exits (LoomError: a user error)."""
        user = isinstance(error, LoomError)
        text = error.format() if isinstance(error, LoomError) else traceback.format_exc()
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        record = {"rank": rank, "reason": reason, "user_error": user, "text": text}
        record.update(at=time.time(), attempt=attempt)
        self._write(f"failure-{attempt:03d}-{rank:04d}.json", json.dumps(record))

    # -- read by the launcher (and by restarted workers)
    def run_dir(self) -> Path | None:
        path = self.folder / "run_dir"
        return Path(path.read_text(encoding="utf-8")) if path.is_file() else None

    def pids(self) -> list[int]:
        found = []
        for path in self.folder.glob("pid-*"):
            try:
                found.append(int(path.read_text(encoding="utf-8")))
            except (OSError, ValueError):  # being written
                continue
        return found

    def failures(self) -> list[Failure]:
        """The failures recorded in the last attempt, the first first."""
        found = self._failures()
        last = max((failure.attempt for failure in found), default=0)
        return [failure for failure in found if failure.attempt == last]

    def user_error(self) -> Failure | None:
        """A user error recorded in any attempt."""
        return next((failure for failure in self._failures() if failure.user_error), None)

    def _failures(self) -> list[Failure]:
        found = []
        for path in self.folder.glob("failure-*.json"):
            try:
                found.append(Failure(**json.loads(path.read_text(encoding="utf-8"))))
            except (OSError, ValueError, TypeError):  # being written
                continue
        return sorted(found, key=lambda failure: failure.at)

    def _write(self, name: str, text: str) -> None:
        partial = self.folder / f".{name}.{os.getpid()}"
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, self.folder / name)  # whole or absent, for a reader polling it


# ---- launching ---------------------------------------------------------------------------
class LaunchFailed(LoomError):
    headline = "launch failed"


class WorkerFailed(Exception):
    """A worker died after the allowed restarts (an internal error in a worker: exit 1).
    `killed`: the global ranks whose process a signal killed (kill -9, the out-of-memory
    killer), by the signal's name: such a worker records no failure of its own."""

    def __init__(self, error: Any) -> None:
        super().__init__(str(error))
        self.killed = {
            int(rank): failure.signal_name()
            for rank, failure in (getattr(error, "failures", None) or {}).items()
            if isinstance(getattr(failure, "exitcode", None), int) and failure.exitcode < 0
        }

    def first_failures(self, recorded: list[Failure]) -> list[Failure]:
        """The failures to report, the cause first: a worker killed by a signal before the
        ones that recorded an error (its peers then fail on the connection it closed)."""
        attempt = max((failure.attempt for failure in recorded), default=0)
        known = {failure.rank for failure in recorded}
        killed = [
            Failure(
                rank,
                f"killed by {name}",
                False,
                f"the process of rank {rank} was killed by {name} (kill -9, or the kernel's "
                "out-of-memory killer: see `dmesg`); the other ranks then lost their "
                "connection to it",
                0.0,
                attempt,
            )
            for rank, name in sorted(self.killed.items())
            if rank not in known
        ]
        return [*killed, *recorded]


def launch(
    options: LaunchOptions,
    entry: Callable[..., Any],
    arguments: Sequence[Any],
    run_id: str,
    handoff: Handoff,
) -> dict[int, Any]:
    """Run `entry(*arguments)` in `options.nproc` workers of this node through the elastic
    launcher; their return values by global rank (this node's). `entry` must be importable
    (the workers are spawned) and call `handoff.start_worker` first. Signals this process
    receives meanwhile are passed on to the workers; one that comes while none has started
    (the rendezvous waiting for other machines) stops the launch (KeyboardInterrupt)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousTimeoutError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    endpoint = options.rdzv_endpoint or f"127.0.0.1:{free_port()}"
    if options.node_rank == 0:
        check_port_free(endpoint)
    try:
        keeper = StoreKeeper(endpoint, options.nnodes, options.node_rank, run_id)
    except RuntimeError as failed:  # torch's DistError: the port taken since the check, ...
        reason = first_line(failed)
        raise _cannot_host(endpoint, reason, "in use" in reason.lower()) from None
    # Of --rdzv-timeout, the part spent waiting for node 0's port: the rendezvous has the rest.
    waited = _wait_for_node_0(endpoint, options.rdzv_timeout) if options.node_rank else 0.0
    # The agent logs every worker's exit with a traceback; what failed is said by the caller
    # (a user error in a worker's own words, an internal one through WorkerFailed).
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)  # "Terminating"
    config = LaunchConfig(
        min_nodes=options.nnodes,
        max_nodes=options.nnodes,
        nproc_per_node=options.nproc,
        run_id=run_id,
        rdzv_backend="c10d",
        rdzv_endpoint=endpoint,
        rdzv_configs={
            "is_host": options.node_rank == 0,
            "join_timeout": max(1, round(options.rdzv_timeout - waited)),
            "read_timeout": options.rdzv_timeout,
            "rank": options.node_rank,
        },
        max_restarts=options.max_restarts,
        start_method="spawn",
        # In the handoff folder, which the caller removes (by default the agent leaves an
        # empty torchelastic_* folder in /tmp at every launch).
        logs_specs=DefaultLogsSpecs(log_dir=str(handoff.folder / "logs")),
    )
    outcome: dict[str, Any] = {}

    def agent() -> None:
        try:
            outcome["results"] = dict(elastic_launch(config, entry)(*arguments))
        except BaseException as error:
            outcome["error"] = error

    thread = threading.Thread(target=agent, name="torchloom-elastic-agent", daemon=True)
    try:
        with passed_on(handoff) as signals:
            thread.start()
            signals.wait_for(thread)
    except BaseException:
        keeper.close()
        raise
    error = outcome.get("error")
    if error is None:
        keeper.succeeded()
        return dict(outcome["results"])
    keeper.close()  # a launch that failed has nobody to wait for: its port is free again
    if signals.received:  # the workers stopped by a signal, one of them at once (a second)
        raise KeyboardInterrupt from error
    if isinstance(error, ChildFailedError):
        raise WorkerFailed(error) from error
    if isinstance(error, RendezvousTimeoutError):
        raise LaunchFailed.at(
            "command line",
            f"--rdzv-endpoint {endpoint}",
            f"the {options.nnodes} machines of --nnodes did not all join within "
            f"--rdzv-timeout {options.rdzv_timeout} s",
            f"start `loom train` with --nnodes {options.nnodes} and this --rdzv-endpoint on "
            "every machine (each its own --node-rank), or raise --rdzv-timeout",
        ) from error
    if isinstance(error, Exception) and options.node_rank != 0:
        raise _node_0_silent(endpoint, options.rdzv_timeout, first_line(error)) from error
    if isinstance(error, Exception):  # the rendezvous could not form (a port in use, ...)
        raise LaunchFailed.at(
            "command line",
            f"rendezvous at {endpoint}",
            f"could not start the workers: {first_line(error)}",
            "check that the port is free and every node can reach node 0",
        ) from error
    raise error


def _wait_for_node_0(endpoint: str, timeout: int) -> float:
    """The seconds waited until node 0's rendezvous took a connection (at most `timeout`).
    torch's store client would wait too, printing a C++ stack trace at every failed try."""
    started = time.monotonic()
    while True:
        try:
            socket.create_connection(host_and_port(endpoint), timeout=1.0).close()
            return time.monotonic() - started
        except OSError as error:
            if time.monotonic() >= started + timeout:
                raise _node_0_silent(endpoint, timeout, error.strerror or str(error)) from None
        time.sleep(0.5)


def _node_0_silent(endpoint: str, timeout: int, reason: str) -> LaunchFailed:
    return LaunchFailed.at(
        "command line",
        f"--rdzv-endpoint {endpoint}",
        f"node 0's rendezvous did not answer within --rdzv-timeout {timeout} s: {reason}",
        "start node 0 (--node-rank 0) with the same --rdzv-endpoint, and check that this "
        "machine reaches that address and port",
    )


def check_port_free(endpoint: str) -> None:
    """Node 0 hosts the rendezvous: a port something else listens on would make it wait on a
    stranger until the rendezvous times out, so it is refused at once. A name with several
    addresses (localhost: ::1 and 127.0.0.1) is this machine's if one of them binds."""
    try:
        addresses = socket.getaddrinfo(*host_and_port(endpoint), type=socket.SOCK_STREAM)
    except OSError as error:
        raise _cannot_host(endpoint, error.strerror or str(error), False) from None
    failures = []
    for family, *_, address in addresses:
        try:
            with socket.socket(family) as probe:
                probe.bind(address)
            return
        except OSError as error:
            failures.append(error)
    taken = any(error.errno == errno.EADDRINUSE for error in failures)
    first = next((e for e in failures if e.errno == errno.EADDRINUSE), failures[0])
    raise _cannot_host(endpoint, first.strerror or str(first), taken) from None


def _cannot_host(endpoint: str, reason: str, taken: bool = True) -> LaunchFailed:
    return LaunchFailed.at(
        "command line",
        f"--rdzv-endpoint {endpoint}",
        f"cannot host the rendezvous there: {reason}",
        "choose a free port (another run or program uses this one)"
        if taken
        else "give an address of this machine (node 0 hosts the rendezvous), e.g. its name",
    )
