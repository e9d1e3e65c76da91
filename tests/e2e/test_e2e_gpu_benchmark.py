"""The prepared GPU session (benchmarks/gpu_session.sh, gpu_throughput.py; host_step.py, its CPU
stand-in) must not rot while no GPU is lent: what it asks of the engine is checked here, in a
second, without data.
`benchmarks/gpu_session.sh --cpu` runs the whole session on the CPU (about a minute)."""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
import torch

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
    for script in ("gpu_session.sh", "gpu_sort_of_clevr.sh", "gpu_prepare.sh", "gpu_install.sh"):
        result = subprocess.run(
            ["bash", "-n", str(ROOT / "benchmarks" / script)], capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr


def fake_wheel(folder: Path, name: str) -> None:
    """The smallest wheel pip installs: one module, named `name`."""
    info = f"{name}-1.0.dist-info"
    files = {
        f"{name}.py": "",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(folder / f"{name}-1.0-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)


THIS_PYTHON = "{}.{}".format(*sys.version_info[:2])


@pytest.mark.parametrize(
    ("cpu", "wheels_for", "installed"),
    [
        ("0", "2.7", {"torchloom", "pydantic"}),  # the GPU machine: every wheel, always
        ("1", THIS_PYTHON, {"torchloom", "pydantic"}),  # a venv emulating the GPU's Python
        ("1", "2.7", {"torchloom"}),  # the project's venv: has the dependencies already
    ],
)
def test_the_offline_install_takes_the_dependency_wheels_where_they_fit(
    tmp_path: Path, cpu: str, wheels_for: str, installed: set[str]
) -> None:
    """A dry run (--cpu) on a Python of the carried wheels' version installs them as the GPU
    machine does, so an emulation of its image tests them; elsewhere only torchloom's."""
    carry = tmp_path / "carry"
    (carry / "wheels").mkdir(parents=True)
    (carry / "fashion-mnist").mkdir()
    for name in ("torchloom", "pydantic"):
        fake_wheel(carry / "wheels", name)
    (carry / "python-version").write_text(wheels_for + "\n")
    (carry / "fashion-mnist" / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(b"labels"))
    site, fashion = tmp_path / "site", tmp_path / "fashion"
    script = ROOT / "benchmarks" / "gpu_install.sh"
    environment = {
        **os.environ,
        **{"CPU": cpu, "CARRY": str(carry), "SITE": str(site), "PY": sys.executable},
        "FASHION": str(fashion),
    }
    result = subprocess.run(
        ["bash", "-c", f'source "{script}" && install_offline'],
        env=environment,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert {module.stem for module in site.glob("*.py")} == installed
    assert (fashion / "t10k-labels-idx1-ubyte").read_bytes() == b"labels"


def test_the_session_steps_fit_one_device_call() -> None:
    """Every step's limit (`step NAME LIMIT ...`, `lenet NAME LIMIT ...`) adds up to at most
    560 s: with the 10 s a step may take to stop and the session's own 590 s deadline, the
    600 s call is never killed from outside (its last lines would not be written)."""
    script = (ROOT / "benchmarks" / "gpu_session.sh").read_text()
    limits = {
        match[1]: int(match[2])
        for match in re.finditer(r"^\s*(?:step|lenet) (\S+) (\d+) ", script, re.MULTILINE)
    }
    assert set(limits) >= {"install", "versions", "nvidia-smi", "cuda-tests", "throughput"}
    assert sum(limits.values()) <= 560, limits


def test_the_session_names_cuda_tests_that_exist() -> None:
    """The CUDA tests the session runs are named by their node ids: a renamed test would only
    be found missing on a lent GPU, where pytest's "not found" costs the step."""
    script = (ROOT / "benchmarks" / "gpu_session.sh").read_text()
    named = re.findall(r'"(tests/[\w/]+\.py)::(\w+)"', script)
    assert len(named) >= 5
    for path, test in named:
        assert f"def {test}(" in (ROOT / path).read_text(encoding="utf-8"), f"{path}::{test}"


def test_the_profile_reports_the_profiled_steps_operators(throughput: ModuleType) -> None:
    """`--profile`'s report (written once, on a GPU): the steps' time, the synchronisations
    counted (none on the CPU), the operators the steps ran and the Python functions."""
    profile = throughput.StepProfile(torch.device("cpu"), "a side")
    a = torch.randn(64, 64)
    profile.start()
    for _ in range(3):
        a = torch.mm(a, a).tanh()
    profile.stop(3)
    report = profile.report()
    assert report.startswith("==== a side: 3 steps in ")
    assert "host-device synchronisations: 0" in report
    assert "aten::mm" in report and "aten::tanh" in report
    assert "-- cProfile, by own time --" in report


def test_the_host_step_benchmark_config_is_a_valid_training_config(tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(ROOT / "benchmarks"))
        host_step = load_script(ROOT / "benchmarks" / "host_step.py")
    config = host_step.write_config(tmp_path, str(tmp_path), 200)
    names = check_training(config, ())
    assert {"training.loss", "training.accuracy"} <= set(names)  # what training reports


def test_the_sort_of_clevr_run_takes_the_epochs_its_seconds_hold() -> None:
    """`sort_of_clevr.py --fit-seconds`: the epochs a run ends in, from a probe's speed (one
    epoch and its validation, a tenth more, besides the warm-up twice and the test); never
    more than the cap, none when not one epoch fits."""
    script = load_script(ROOT / "benchmarks" / "sort_of_clevr.py")
    eager = script.Probe("eager", 0.013, 20.0, 3063)  # the H200's eager step, 2026-11-27
    share = 500 / 9800
    epoch = 3063 * 0.013 * (1 + share)
    expected = int((690 - 2 * 20.0 - 2 * epoch * share) / (epoch * 1.1))
    assert script.epochs_that_fit(690, eager, share, 40) == expected == 14
    assert script.epochs_that_fit(690, script.Probe("eager", 0.001, 20.0, 3063), share, 40) == 40
    assert script.epochs_that_fit(90, eager, share, 40) == 0


def test_the_step_operations_are_counted_by_part_and_torchloom_adds_few(tmp_path: Path) -> None:
    """benchmarks/step_ops.py on a small Sort-of-CLEVR (its default config): the count by part
    of the step, and what torchloom's own parts add to the model's, which on a GPU are kernel
    launches (docs/benchmarks.md, "Tensor operations a step": 28 against the model's 317)."""
    small = [
        "training.task.images=20",
        "training.task.image_size=32",
        "training.task.object_size=3",
        "pipeline.image_encoder.layers=["
        + ",".join(["{out_channels: 8, stride: 2, padding: 1, pool: 1}"] * 3)
        + "]",
    ]
    script = str(ROOT / "benchmarks" / "step_ops.py")
    result = subprocess.run(
        [
            sys.executable,
            script,
            "--warmup",
            "2",
            "--steps",
            "3",
            *(f"--override={o}" for o in small),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    parts = dict(re.findall(r"^  ([a-z ]+): ([\d.]+)", result.stdout, re.MULTILINE))
    assert set(parts) >= {"model forward", "backward", "optimizer", "statistics and meters"}
    assert float(parts["statistics and meters"]) <= 20  # two grouped accuracies: 6 calls each
    shares = re.search(r"optimizer: ([\d.]+); torchloom's own: ([\d.]+)", result.stdout)
    assert shares is not None, result.stdout
    model, own = float(shares[1]), float(shares[2])
    assert model > 200 and own <= 0.1 * model  # 114 of 317 before the grouped accuracy's buffers
