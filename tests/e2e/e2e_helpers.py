"""Small real MNIST runs for end-to-end tests: a few hundred images, two short epochs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

LOOM = [sys.executable, "-m", "torchloom.cli.main"]


def small_config(folder: Path, data: Path, base: str = "loom://mnist/lenet5.yml") -> Path:
    """A LeNet-5 run on 1,024 training images that trains in a second or two."""
    text = f"""\
default_configs: [{base}]
training:
  task: {{data_folder: {data}, subset: 1024}}
  dataloader: {{batch_size: 32}}
  seed: 7
  logging_interval: 8
  terminal_conditions: {{epoch_limit: 2}}
validation:
  task: {{subset: 256}}
test:
  task: {{subset: 256}}
"""
    path = folder / "small.yml"
    path.write_text(text, encoding="utf-8")
    return path


def run_loom(
    *args: str, cwd: Path | None = None, timeout: int = 300
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [*LOOM, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )


def only_run(expdir: Path) -> Path:
    (run,) = [p for p in expdir.glob("*/*") if p.is_dir()]
    return run


def summary(run: Path) -> dict[str, Any]:
    return dict(json.loads((run / "summary.json").read_text(encoding="utf-8")))


def weights(run: Path, name: str = "last.pt") -> dict[str, dict[str, torch.Tensor]]:
    state = torch.load(run / "checkpoints" / name, weights_only=True)
    return dict(state["components"])


def assert_bit_identical(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for component in a:
        for key, tensor in a[component].items():
            assert torch.equal(tensor, b[component][key]), f"{component}.{key} differs"
