"""summary.json: how a run ended and what it reached, and the final test pass.

Written at the start (status "running"), so a run killed with SIGKILL still says so, and
again at the end with the status, reason, counters, wall time and statistics per section.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchloom.engine.checkpoint import load_checkpoint
from torchloom.engine.evaluation import evaluate, statistics_copy
from torchloom.engine.reporting import format_statistics
from torchloom.engine.run_folder import write_text_atomic
from torchloom.errors import LoomError
from torchloom.statistics.csv_log import CsvLog

if TYPE_CHECKING:
    from torchloom.engine.run_state import RunState

REASONS = {
    "converged": "the monitored loss fell below terminal_conditions.loss_stop_threshold",
    "early_stopped": "the monitored statistic stopped improving (early_stopping.patience)",
    "epoch_limit": "terminal_conditions.epoch_limit reached",
    "episode_limit": "terminal_conditions.episode_limit reached",
    "interrupted": "stopped by a signal (Ctrl-C or SIGTERM); resume with --resume",
    "diverged": "a loss became NaN or infinite",
}


@dataclass
class RunResult:
    """What `torchloom.train` returns: the run folder and its summary."""

    run_dir: Path
    summary: dict[str, Any]

    @property
    def status(self) -> str:
        return str(self.summary["status"])

    @property
    def statistics(self) -> dict[str, dict[str, float]]:
        return dict(self.summary.get("final", {}))


def _test_pass(state: RunState) -> dict[str, float]:
    """The test section, evaluated with the best weights (the last ones if none are best)."""
    assert state.test_data is not None
    best = state.run_dir / "checkpoints" / "best.pt"
    if best.exists():
        for name, weights in load_checkpoint(best)["components"].items():
            state.pipeline.components[name].load_state_dict(weights)
    values = evaluate(
        state.pipeline,
        state.test_data.epoch(0),
        statistics_copy(state.pipeline, state.device),
        state.loss,
        state.precision,
        state.device,
        observe=(lambda batch: state.hooks.eval_batch(state, "test", batch))
        if state.hooks
        else None,
    )
    state.hooks.after_eval(state, "test", values, False)
    CsvLog(state.run_dir / "test_statistics.csv").write(
        {"epoch": state.progress.epoch, "episode": state.progress.episode, **values}
    )
    return values


def write_summary(state: RunState, status: str, error: LoomError | None = None) -> RunResult:
    final = {
        section: {k.split(".", 1)[1]: v for k, v in values.items()}
        for section, values in state.latest.items()
    }
    if state.test_data is not None and status not in ("diverged", "interrupted"):
        final["test"] = _test_pass(state)
        state.log.info("test: %s", format_statistics(final["test"]))
    summary = {
        "pipeline": state.name,
        "status": status,
        "reason": error.format() if error is not None else REASONS.get(status, status),
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
    write_text_atomic(
        run_dir / "summary.json",
        json.dumps({"pipeline": name, "status": "running"}, indent=2) + "\n",
    )
