"""Run folders: `<expdir>/<pipeline name>/<YYYYmmdd_HHMMSS>[_<tag>]/`, created atomically;
who trains in one (its lock); how its run ended (summary.json).

`os.mkdir` either creates the folder or fails, so two runs started in the same second can
never share one: the second gets a `-2` suffix (then `-3`, ...). Nothing is ever written
into an existing run folder except by `--resume`, which continues that run.

summary.json is written at the start (status "running", with the process's PID and host), so
a run killed with SIGKILL still says it was running (`loom runs` then asks the run's lock
whether its process lives), and again at the end, however the run ends -- finished,
interrupted, diverged or failed -- with the status, reason, counters, wall time and
statistics per section. (How Ctrl-C and SIGTERM stop a run: engine/state.py, StopSignals.)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchloom.data.atomic_files import write_text_atomic
from torchloom.errors import ConfigError, LoomError, StorageError
from torchloom.run_names import folder_part, run_name_problem, run_tag_problem, shown

__all__ = [
    "RunLock",
    "RunResult",
    "Status",
    "create_run_folder",
    "run_liveness",
    "write_artifacts",
]

if TYPE_CHECKING:  # the run folder module stays torch-free to import
    from torchloom.core.component import Component


def check_run_name(pipeline_name: str) -> None:
    """A ConfigError when `pipeline_name` cannot name a folder of runs (torchloom/run_names.py:
    '.', '..', hidden, empty or too long). The config's `name` is checked with its line when
    the config is validated; this also guards names given in Python."""
    problem = run_name_problem(pipeline_name)
    if problem:
        subject = f"name {shown(pipeline_name)}"
        raise ConfigError.at("", subject, f"names the run folders, and {problem}")


def check_run_tag(tag: str) -> None:
    """A ConfigError when `tag` (`loom train --tag`) cannot end a run folder's name."""
    problem = run_tag_problem(tag)
    if problem:
        raise ConfigError.at("", f"--tag {shown(tag)}", problem, "use a shorter tag")


def create_run_folder(
    expdir: str | os.PathLike[str], pipeline_name: str, tag: str = "", now: float | None = None
) -> Path:
    # Both checked before anything is created: a refused name leaves no empty folder.
    check_run_name(pipeline_name)
    check_run_tag(tag)
    stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(now))
    base = stamp + (f"_{folder_part(tag)}" if tag else "")
    parent = Path(expdir).expanduser() / folder_part(pipeline_name)
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError.at("", f"--expdir '{expdir}'", f"cannot create it: {error}") from error
    for attempt in range(1, 1000):
        folder = parent / (base if attempt == 1 else f"{base}-{attempt}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise ConfigError.at("", f"run folder '{parent / base}'", "too many runs in one second")


def write_artifacts(folder: Path, components: Mapping[str, Component]) -> None:
    """Each component's `artifacts()` (vocabularies built from the training data, ...) into
    `folder/artifacts/<component>/`: a run records what its pipeline was built with."""
    for name, component in components.items():
        for file_name, text in component.artifacts().items():
            target = folder / "artifacts" / name
            target.mkdir(parents=True, exist_ok=True)
            write_text_atomic(target / file_name, text)


# ---- runs that another command started --------------------------------------------------
# A run folder whose pipeline is not the one its config.yaml builds (loom quantize's
# quantization-aware fine-tuning: fake-quantized modules) holds this file, written by the
# command that started it: {"by": that command, "command": what continues the run, "reason":
# why `loom train --resume` cannot, ...the command's own record}. `loom train --resume`
# refuses such a folder naming the command, and an interrupted run's log names it.
STARTED_BY_FILE = "started_by.json"


def read_started_by(run_dir: Path) -> dict[str, Any] | None:
    """The folder's started_by.json, or None when it has none; a damaged one (not a JSON
    object) is read as {} (the folder is still not `loom train`'s to continue)."""
    path = run_dir / STARTED_BY_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def write_started_by(run_dir: Path, record: Mapping[str, Any]) -> None:
    write_text_atomic(run_dir / STARTED_BY_FILE, json.dumps(record, indent=2) + "\n")


# ---- who trains in a run folder ------------------------------------------------------------
LOCK_FILE = ".lock"
HEARTBEAT_SECONDS = 30.0  # the lock file's mtime is refreshed this often while the run lives
# A run on another host whose heartbeat is older than this is shown as dead: its process
# cannot be asked, and a live one would have refreshed the file many times over.
STALE_AFTER_SECONDS = 10 * HEARTBEAT_SECONDS


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
        """Take the lock, or a ConfigError naming the process that holds it."""
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
                    holder = read_lock_record(self.path)
                    raise ConfigError.at(
                        "",
                        f"run folder '{self.path.parent}'",
                        f"is in use by process {holder.get('pid', '?')} on "
                        f"{holder.get('host', '?')} (started "
                        f"{_clock(holder.get('started'))})",
                        "wait for it to end, or stop it (Ctrl-C saves last.pt)",
                    ) from None
                time.sleep(0.05)
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(record) + "\n")
        handle.flush()
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


def _clock(stamp: Any) -> str:
    if not isinstance(stamp, int | float):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def _os_reason(error: OSError) -> str:
    return error.strerror or str(error)


def read_lock_record(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
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


# ---- summary.json ---------------------------------------------------------------------------
class Status(str, Enum):
    """How a run stands, as summary.json records it (the value is what the file holds)."""

    RUNNING = "running"
    CONVERGED = "converged"
    EARLY_STOPPED = "early_stopped"
    EPOCH_LIMIT = "epoch_limit"
    EPISODE_LIMIT = "episode_limit"
    INTERRUPTED = "interrupted"
    STOPPED = "stopped"
    DIVERGED = "diverged"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value

    @property
    def reason(self) -> str:
        """Why a run with this status ended, for summary.json."""
        return _REASONS[self]

    @property
    def finished(self) -> bool:
        """Whether the run reached one of its terminal conditions (so resuming it does
        nothing unless a condition is raised), as opposed to being stopped or crashing."""
        return self in (
            Status.CONVERGED,
            Status.EARLY_STOPPED,
            Status.EPOCH_LIMIT,
            Status.EPISODE_LIMIT,
            Status.DIVERGED,
        )

    @property
    def requested(self) -> bool:
        """Whether the run stopped because it was asked to, mid-way: it saved last.pt."""
        return self in (Status.INTERRUPTED, Status.STOPPED)

    @property
    def by_limit(self) -> bool:
        return self in (Status.EPOCH_LIMIT, Status.EPISODE_LIMIT)


_REASONS = {
    Status.RUNNING: "the run has not ended",
    Status.CONVERGED: "the monitored loss fell below terminal_conditions.loss_stop_threshold",
    Status.EARLY_STOPPED: "the monitored statistic stopped improving (early_stopping.patience)",
    Status.EPOCH_LIMIT: "terminal_conditions.epoch_limit reached",
    Status.EPISODE_LIMIT: "terminal_conditions.episode_limit reached",
    Status.INTERRUPTED: "stopped by a signal (Ctrl-C, SIGTERM or SIGHUP); resume with --resume",
    Status.STOPPED: "stopped by a hook",  # the summary gives the hook's own reason
    Status.DIVERGED: "a loss became NaN or infinite",
    Status.FAILED: "an error ended the run",
}


@dataclass
class RunResult:
    """What `torchloom.train` returns: the run folder and its summary. `already_finished`:
    a resumed run that had nothing left to do (engine/resume.py)."""

    run_dir: Path
    summary: dict[str, Any]
    already_finished: bool = False

    @property
    def status(self) -> str:
        return str(self.summary["status"])

    @property
    def statistics(self) -> dict[str, dict[str, float]]:
        return dict(self.summary.get("final", {}))


def write_summary(run_dir: Path, summary: Mapping[str, Any]) -> RunResult:
    write_text_atomic(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return RunResult(run_dir, dict(summary))


def failure_reason(error: BaseException) -> str:
    """One line saying what ended a run (summary.json's reason): a user error's message, else
    the exception's type and the first line of its message."""
    if isinstance(error, LoomError):
        return error.format().splitlines()[0]
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


# How torch words BatchNorm's refusal of one value per channel (functional._verify_batch_size).
BATCH_NORM_NEEDS_TWO = "Expected more than 1 value per channel when training"
# How torch words its refusal of an operation in deterministic mode (torch/__init__.py).
NO_DETERMINISTIC_VERSION = "does not have a deterministic implementation"


def as_user_error(error: BaseException, run_dir: Path) -> BaseException:
    """What ended a run, as the user error it is when it is one: a failed write (OSError) a
    StorageError naming the path; torch's refusal, under `training.deterministic`, of an
    operation it has no deterministic version of a ConfigError naming the key, since the
    config asks for what the pipeline cannot give; BatchNorm's refusal of a training batch of
    one sample (a last batch of one, with 1x1 maps) a ConfigError naming drop_last. Any other
    error as it is."""
    if isinstance(error, LoomError):
        return error
    if isinstance(error, OSError):
        return StorageError.from_os(error.filename or run_dir, error)
    message = str(error)
    if isinstance(error, RuntimeError) and NO_DETERMINISTIC_VERSION in message:
        return ConfigError.at(
            str(run_dir / "config.yaml"),
            "training.deterministic",
            f"is true, and torch has no deterministic version of {message.split()[0]}, which "
            "the pipeline runs on this device",
            "set training.deterministic: false, or replace the component that uses it",
        )
    if isinstance(error, ValueError) and BATCH_NORM_NEEDS_TWO in message:
        return ConfigError.at(
            str(run_dir / "config.yaml"),
            "training.dataloader",
            "a training batch had one sample where a batch normalisation layer's maps are 1x1: "
            "it cannot normalise a single value per channel (the epoch's last batch, when the "
            "split's size leaves one over)",
            "set training.dataloader.drop_last: true, or another batch_size",
        )
    return error


def write_running(run_dir: Path, name: str) -> None:
    running = {
        "pipeline": name,
        "status": Status.RUNNING.value,
        "pid": os.getpid(),
        "host": socket.gethostname(),
    }
    write_summary(run_dir, running)


def read_summary(run_dir: Path) -> dict[str, Any]:
    """A run folder's summary.json, or {} when it is missing or unreadable."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}
