"""`training.dataloader.reservoir` through `loom train`: a deterministic run repeats itself,
and no reservoir worker outlives the command, whether the run ends, fails or is stopped with
Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from e2e_helpers import LOOM, only_run, summary

from live_processes import alive, children
from torchloom.config import dump_config
from torchloom.engine.checkpoint import load_checkpoint

TESTS = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "PYTHONUNBUFFERED": "1",
    "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p),
}


def reservoir_config(
    folder: Path, epochs: int = 2, loader_workers: int = 0, **reservoir: Any
) -> Path:
    """A toy run with a reservoir; with `loader_workers`, with that many DataLoader workers
    instead."""
    dataloader: dict[str, Any] = {
        "batch_size": 8,
        "reservoir": {"size": 16, "replacement_rate": 0.25, "workers": 2, **reservoir},
    }
    if loader_workers:
        dataloader = {"batch_size": 8, "num_workers": loader_workers}
    config: dict[str, Any] = {
        "name": "toy",
        "training": {
            "task": {"type": "toy_components:ToyTask", "size": 44},
            "dataloader": dataloader,
            "optimizer": {"type": "SGD", "lr": 0.1},
            "seed": 3,
            "logging_interval": 2,
            "terminal_conditions": {"epoch_limit": epochs},
        },
        "validation": {"task": {"type": "toy_components:ToyTask", "size": 21}},
        "pipeline": {
            "model": {
                "type": "toy_components:ToyLinear",
                "globals": {"prediction_size": "num_classes"},
            },
            "loss": {"type": "toy_components:ToyLoss"},
        },
    }
    path = folder / "toy.yml"
    path.write_text(dump_config(config), encoding="utf-8")
    return path


def watched(
    args: list[str], stop_when: Any = None, signum: int = signal.SIGINT
) -> tuple[int, str, set[int]]:
    """Run `loom` noting its child processes; with `stop_when()`, press Ctrl-C (SIGINT to its
    whole process group, as a terminal does), or send `signum` to the group as a scheduler
    does, once that is true."""
    process = subprocess.Popen(
        [*LOOM, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    seen: set[int] = set()
    deadline = time.monotonic() + 180
    while process.poll() is None and time.monotonic() < deadline:
        seen |= children(process.pid)
        if stop_when is not None and stop_when() and len(seen) >= 2:
            os.killpg(process.pid, signum)  # Ctrl-C reaches the workers too
            stop_when = None
        time.sleep(0.02)
    _, stderr = process.communicate(timeout=60)
    return process.returncode, stderr, seen


def test_a_deterministic_reservoir_run_resumes_exactly_and_leaves_no_worker(
    tmp_path: Path,
) -> None:
    """Left alone, and stopped after 5 of 12 episodes and resumed: bit-identical weights (the
    reservoir's slots, draws and next job are in last.pt, its samples made again)."""
    runs = []
    for name, limit in (
        ("whole", []),
        ("resumed", ["+training.terminal_conditions.episode_limit=5"]),
    ):
        folder = tmp_path / name
        folder.mkdir()
        config = reservoir_config(folder, deterministic=True)
        code, stderr, seen = watched(
            ["train", str(config), "--expdir", str(folder / "runs"), "--quiet", *limit]
        )
        assert code == 0, stderr
        assert len(seen) >= 2  # the reservoir's two workers ran
        assert not any(alive(pid) for pid in seen), "a reservoir worker outlived the run"
        runs.append(only_run(folder / "runs"))
    whole, resumed = runs
    assert summary(resumed)["episodes"] == 5
    code, stderr, seen = watched(
        [
            "train",
            "--resume",
            str(resumed),
            "--quiet",
            "training.terminal_conditions.episode_limit=12",
        ]
    )
    assert code == 0, stderr
    assert not any(alive(pid) for pid in seen)
    assert summary(whole)["episodes"] == summary(resumed)["episodes"] == 12
    expected, got = (
        load_checkpoint(run / "checkpoints" / "last.pt")["components"]["model"] for run in runs
    )
    for key, tensor in expected.items():
        assert torch.equal(tensor, got[key]), key


def test_ctrl_c_stops_a_reservoir_run_and_its_workers(tmp_path: Path) -> None:
    config = reservoir_config(tmp_path, epochs=100000)
    expdir = tmp_path / "runs"

    def training() -> bool:
        return any(expdir.glob("*/*/training_statistics.csv"))

    code, stderr, seen = watched(["train", str(config), "--expdir", str(expdir)], training)
    assert code == 130, stderr
    assert "Traceback" not in stderr
    assert len(seen) >= 2 and not any(alive(pid) for pid in seen)
    run = only_run(expdir)
    assert summary(run)["status"] == "interrupted"
    assert (run / "checkpoints" / "last.pt").exists()


@pytest.mark.parametrize("loader", ["reservoir", "num_workers"])
def test_sigterm_to_the_process_group_interrupts_the_run(tmp_path: Path, loader: str) -> None:
    """Slurm's scancel and systemd send SIGTERM to every process of the job: the workers
    died of it (a reservoir's reset it to the default; a DataLoader's took the run's handler
    as their own), and the run ended `failed` without last.pt though a stop was asked."""
    # Deterministic: each step waits for its samples, so a dead worker is noticed at once.
    workers = 2 if loader == "num_workers" else 0
    config = reservoir_config(tmp_path, 100000, loader_workers=workers, deterministic=True)
    expdir = tmp_path / "runs"

    def training() -> bool:
        return any(expdir.glob("*/*/training_statistics.csv"))

    code, stderr, seen = watched(
        ["train", str(config), "--expdir", str(expdir)], training, signal.SIGTERM
    )
    assert code == 130, stderr
    assert "Traceback" not in stderr
    assert len(seen) >= 2 and not any(alive(pid) for pid in seen)
    run = only_run(expdir)
    assert summary(run)["status"] == "interrupted", summary(run)["reason"]
    assert (run / "checkpoints" / "last.pt").exists()


def test_an_exception_in_training_ends_the_run_and_its_workers(tmp_path: Path) -> None:
    config = reservoir_config(tmp_path)
    config.write_text(
        config.read_text() + "  boom:\n    type: trust_components:FailsAtStep\n    at: 4\n"
    )
    code, stderr, seen = watched(["train", str(config), "--expdir", str(tmp_path / "runs")])
    assert code == 1 and "boom at step 4" in stderr
    assert len(seen) >= 2 and not any(alive(pid) for pid in seen)
    assert summary(only_run(tmp_path / "runs"))["status"] == "failed"
