"""Shared helpers of the `loom` command-line tests: run the CLI in-process, write configs.

Most tests call `run_loom` (tests/in_process_loom.py: `torchloom.cli.main.main(argv)` in this
process, what it printed read through pytest's `capsys`); only the few checks that need a real
process (its exit status, its imports, an uncaught traceback) start one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from in_process_loom import Result as Result
from in_process_loom import run_loom as run_loom

REPO = Path(__file__).resolve().parents[2]
MNIST_CONFIGS = REPO / "src" / "torchloom" / "configs" / "mnist"
DEFAULT_MNIST = MNIST_CONFIGS / "default_mnist.yml"

# A config that passes `loom check`: the shipped MNIST defaults and LeNet-5. Tests build their
# malformed configs from it, so that each one has exactly the mistake it is about.
INCLUDE_DEFAULTS = f"default_configs: [{DEFAULT_MNIST}]\n"
GOOD_PIPELINE = """\
pipeline:
  image_classifier:
    type: LeNet5
    globals: {prediction_size: num_classes}
  nllloss: {type: NLLLoss}
  accuracy: {type: AccuracyStatistics}
"""
GOOD_CONFIG = INCLUDE_DEFAULTS + GOOD_PIPELINE


def write_config(folder: Path, text: str, name: str = "bad.yml") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def run_loom_process(
    *argv: str, cwd: Path, extra_path: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`loom ARGV...` as a real process (`python -m torchloom.cli.main`)."""
    env = dict(os.environ)
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(extra_path), env.get("PYTHONPATH", "")) if p
        )
    return subprocess.run(
        [sys.executable, "-m", "torchloom.cli.main", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def assert_user_error(result: Result, *culprits: str) -> None:
    """Exit status 2, no traceback, and every culprit text named in the message."""
    assert result.status == 2, (result.status, result.err)
    assert "Traceback" not in result.err, result.err
    assert result.err.strip(), "a user error must say what is wrong"
    for culprit in culprits:
        assert culprit in result.err, f"{culprit!r} not in:\n{result.err}"
