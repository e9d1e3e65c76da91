"""Who trains in a run folder: an exclusive OS lock on `<run>/.lock` (RunLock), held for as
long as the run trains, and what a reader can tell from it (run_liveness): whether the
process that holds it lives, on this host or, by its heartbeat, another."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchloom.data.atomic_files import refuse_links
from torchloom.data.json_files import UnreadableJson, read_json
from torchloom.errors import ConfigError, StorageError

LOCK_FILE = ".lock"
HEARTBEAT_SECONDS = 30.0  # the lock file's mtime is refreshed this often while the run lives
# A run on another host whose heartbeat is older than this is shown as dead: its process
# cannot be asked, and a live one would have refreshed the file many times over.
STALE_AFTER_SECONDS = 10 * HEARTBEAT_SECONDS
# The record is a PID, a host name and a start time: a larger file is none of ours.
MAX_LOCK_BYTES = 64_000


class RunLock:
    """An exclusive OS lock (`flock`) on `<run>/.lock`, held by the process that trains in the
    run folder for as long as it trains. The kernel releases it when the process dies, however
    it dies (SIGKILL included), so a free lock means that no process is training there. The
    file records the holder's PID, host and start time, and its mtime is a heartbeat, refreshed
    by a daemon thread, for readers on another host (`loom runs` over a shared file system)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_FILE
        self._handle: Any = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def acquire(self) -> RunLock:
        """Take the lock, or a ConfigError naming the process that holds it (or the folder's
        symbolic links: what takes the lock writes into the folder)."""
        refuse_links(self.path.parent)
        try:
            handle = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 (held until release)
        except OSError as error:
            raise ConfigError.at(
                "", f"run folder '{self.path.parent}'", _os_reason(error)
            ) from error
        # A reader probing the lock (`loom runs`) holds it for microseconds: try a few times.
        for attempt in range(20):
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt == 19:
                    handle.close()
                    raise in_use(self.path.parent) from None
                time.sleep(0.05)
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps(record) + "\n")
            handle.flush()
        except OSError as error:  # a full disk
            handle.close()
            raise StorageError.from_os(self.path, error, "cannot record the run's lock") from error
        self._handle = handle
        self._beat = threading.Thread(target=self._heartbeat, name="torchloom-heartbeat")
        self._beat.daemon = True
        self._beat.start()
        return self

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        self._stop.set()
        if self._handle is not None:
            self._handle.close()  # closing the only descriptor releases the flock
            self._handle = None


class NoLock:
    """What a process other than rank 0 of several holds: rank 0 holds the folder's lock."""

    def release(self) -> None: ...


def in_use(run_dir: Path, note: str = "") -> ConfigError:
    """The error for a run folder another process holds, naming it from the lock's record."""
    holder = read_lock_record(run_dir / LOCK_FILE)
    return ConfigError.at(
        "",
        f"run folder '{run_dir}'",
        f"is in use by process {holder.get('pid', '?')} on {holder.get('host', '?')} "
        f"(started {_clock(holder.get('started'))}){note}",
        "wait for it to end, or stop it (Ctrl-C saves last.pt)",
    )


def _clock(stamp: Any) -> str:
    if not isinstance(stamp, int | float):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def _os_reason(error: OSError) -> str:
    return error.strerror or str(error)


def read_lock_record(path: Path) -> dict[str, Any]:
    try:
        record = read_json(path, MAX_LOCK_BYTES)
    except UnreadableJson:  # none, one being written (empty), a damaged one
        return {}
    return record if isinstance(record, dict) else {}


@dataclass(frozen=True)
class Liveness:
    """Whether a process trains in a run folder now, as far as this machine can tell."""

    alive: bool
    pid: int | None = None
    host: str | None = None
    heartbeat: float | None = None  # the lock file's mtime (unix time), when there is one
    reason: str = ""


def run_liveness(run_dir: Path, now: float | None = None) -> Liveness:
    """On this host the lock answers for certain (a free lock: nobody trains there). For a run
    held by another host (a shared file system), the heartbeat's age decides. A run folder
    without a lock file was never locked (older torchloom): no process is known to hold it."""
    path = Path(run_dir) / LOCK_FILE
    try:
        heartbeat = path.stat().st_mtime
    except OSError:
        return Liveness(False, reason="no lock file: no process holds the run")
    record = read_lock_record(path)
    pid, host = record.get("pid"), record.get("host")
    pid = pid if isinstance(pid, int) else None
    host = host if isinstance(host, str) else None
    if host is not None and host != socket.gethostname():
        age = (time.time() if now is None else now) - heartbeat
        alive = age <= STALE_AFTER_SECONDS
        reason = f"heartbeat from {host} {age:.0f} s ago"
        return Liveness(alive, pid, host, heartbeat, reason)
    try:
        with open(path, encoding="utf-8") as probe:
            fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released when probe closes
    except BlockingIOError:
        return Liveness(True, pid, host, heartbeat, f"held by process {pid}")
    except OSError as error:
        return Liveness(False, pid, host, heartbeat, f"lock unreadable: {_os_reason(error)}")
    gone = f"process {pid} is gone" if pid is not None else "the process that took it is gone"
    return Liveness(False, pid, host, heartbeat, gone)
