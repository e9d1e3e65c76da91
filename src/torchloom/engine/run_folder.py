"""Run folders: `<expdir>/<pipeline name>/<YYYYmmdd_HHMMSS>[_<tag>]/`, created atomically;
how its run ended (summary.json). Who trains in one (its lock): engine/run_lock.py.

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

import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchloom.data.atomic_files import write_text_atomic
from torchloom.data.json_files import UnreadableJson, read_json
from torchloom.errors import ConfigError, LoomError, StorageError
from torchloom.run_names import folder_part, run_name_problem, run_tag_problem, shown

__all__ = [
    "RunResult",
    "Status",
    "create_run_folder",
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
        hint = "use a shorter tag" if "long" in problem else "use letters or digits"
        raise ConfigError.at("", f"--tag {shown(tag)}", problem, hint)


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
        record = read_json(path)
    except UnreadableJson:
        return {}
    return record if isinstance(record, dict) else {}


def started_by_another(run_dir: Path) -> tuple[str, str] | None:
    """(why, suggestion) when the folder is a run another command started (a QAT
    fine-tuning, whose fake-quantized modules its config.yaml does not rebuild): it cannot be
    evaluated, exported or quantized as a run of `loom train`; None otherwise."""
    started_by = read_started_by(run_dir)
    if started_by is None:
        return None
    source = started_by.get("source_run")
    why = started_by_reason(started_by, "its config.yaml alone does not rebuild it")
    where = f"its result is in {source}/quantized/ (loom process, loom predict of that run)"
    return why, where if source else "use the run it was made from"


def started_by_reason(started_by: Mapping[str, Any], rebuild: str) -> str:
    """Why a run another command started (its record `started_by`) is not `loom train`'s;
    `rebuild`, unless the record gives a reason. A damaged record ({}) is said to be one."""
    if not started_by:
        return (
            f"has a {STARTED_BY_FILE} that cannot be read (the record of a run another "
            "command started, whose config.yaml alone may not rebuild it)"
        )
    by = started_by.get("by") or "another command"
    return f"is a run `{by}` started: {started_by.get('reason') or rebuild}"


def write_started_by(run_dir: Path, record: Mapping[str, Any]) -> None:
    write_text_atomic(run_dir / STARTED_BY_FILE, json.dumps(record, indent=2) + "\n")


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


def stopped_at_once_reason(run_dir: Path, second: bool) -> str:
    """summary.json's reason for a run stopped at once: by a second signal, or by an interrupt
    outside the run's graceful stop (a signal at its first moment, or raised by a hook),
    which may have left no last.pt."""
    how = "a second signal" if second else "an interrupt outside the run's graceful stop"
    if (run_dir / "checkpoints" / "last.pt").exists():
        return f"stopped at once by {how}; last.pt holds the last save"
    return f"stopped at once by {how}, before its first save: start the run again"


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
        summary = read_json(run_dir / "summary.json")
    except UnreadableJson:
        return {}
    return summary if isinstance(summary, dict) else {}
