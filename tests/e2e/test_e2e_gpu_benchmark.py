"""The prepared GPU session (benchmarks/gpu_session.sh, gpu_throughput.py) must not rot while
no GPU is lent: what it asks of the engine is checked here, in a second, without data.
`benchmarks/gpu_session.sh --cpu` runs the whole session on the CPU (about a minute)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from script_modules import load_script
from torchloom.api import check_training

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def throughput(pytestconfig: pytest.Config) -> ModuleType:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(ROOT / "benchmarks"))  # it imports overhead.py beside it
        return load_script(ROOT / "benchmarks" / "gpu_throughput.py")


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_the_throughput_overrides_are_a_valid_training_config(
    throughput: ModuleType, tmp_path: Path, mode: str
) -> None:
    names = check_training(throughput.CONFIG, throughput.overrides(256, 210, str(tmp_path), mode))
    assert "training.loss" in names
    assert not any(name.startswith("validation.") for name in names)  # no evaluation timed


def test_the_default_window_stays_inside_the_first_epoch(throughput: ModuleType) -> None:
    args = throughput.parse([])
    assert args.warmup + args.steps <= 55_000 // args.batch_size
    assert args.modes == ["default", "reduce-overhead"] and args.rounds >= 2


def test_the_session_scripts_parse() -> None:
    for script in ("gpu_session.sh", "gpu_prepare.sh"):
        result = subprocess.run(
            ["bash", "-n", str(ROOT / "benchmarks" / script)], capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr
