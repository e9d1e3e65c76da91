"""summary.json: how a run ended and what it reached.

Written at the start (status "running", with the process's PID and host), so a run killed
with SIGKILL still says it was running (`loom runs` then asks the run's lock whether its
process lives), and again at the end, however the run ends — finished, interrupted, diverged
or failed — with the status, reason, counters, wall time and statistics per section.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchloom.data.atomic_files import write_text_atomic
from torchloom.engine.terminal import Status

if TYPE_CHECKING:
    from torchloom.engine.run_state import RunState


@dataclass
class RunResult:
    """What `torchloom.train` returns: the run folder and its summary. `already_finished`:
    a resumed run that had nothing left to do (see `finished_result`)."""

    run_dir: Path
    summary: dict[str, Any]
    already_finished: bool = False

    @property
    def status(self) -> str:
        return str(self.summary["status"])

    @property
    def statistics(self) -> dict[str, dict[str, float]]:
        return dict(self.summary.get("final", {}))


def write_summary(
    state: RunState, status: Status, reason: str, test: dict[str, float] | None
) -> RunResult:
    final = {
        section: {k.split(".", 1)[1]: v for k, v in values.items()}
        for section, values in state.latest.items()
    }
    if test is not None:
        final["test"] = test
    summary = {
        "pipeline": state.name,
        "status": status.value,
        "reason": reason,
        "epochs": state.progress.epoch,
        "episodes": state.progress.episode,
        "wall_time_seconds": round(state.wall_time(), 3),
        "seed": state.seed,
        "device": str(state.device),
        "monitor": {
            "name": state.monitor.name,
            "mode": state.monitor.mode,
            "best": state.monitor.best,
            "best_epoch": state.monitor.best_epoch,
        },
        "best": state.best_statistics,
        "final": final,
    }
    write_text_atomic(state.run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return RunResult(state.run_dir, summary)


def write_running(run_dir: Path, name: str) -> None:
    running = {
        "pipeline": name,
        "status": Status.RUNNING.value,
        "pid": os.getpid(),
        "host": socket.gethostname(),
    }
    write_text_atomic(run_dir / "summary.json", json.dumps(running, indent=2) + "\n")


def read_summary(run_dir: Path) -> dict[str, Any]:
    """A run folder's summary.json, or {} when it is missing or unreadable."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}
