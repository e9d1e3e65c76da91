"""dump_config round trips, and importing torchloom.config stays free of torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from torchloom.config import dump_config, load_config


def round_trip(tmp_path: Path, data: dict[str, Any]) -> dict[str, Any]:
    path = tmp_path / "dumped.yml"
    path.write_text(dump_config(data), encoding="utf-8")
    return load_config(path).data


def test_loaded_config_round_trips(tmp_path: Path) -> None:
    (tmp_path / "base.yml").write_text("training: {optimizer: {lr: 1e-3}, name: run}\n")
    (tmp_path / "top.yml").write_text(
        "default_configs: [base.yml]\nlabel: ${training.name}_x\nlayers: [1, {a: null}]\n"
    )
    cfg = load_config(tmp_path / "top.yml", ["+flags.on=true"])
    assert round_trip(tmp_path, cfg.data) == cfg.data


@pytest.mark.parametrize(
    "value",
    [
        "1e-3",
        "true",
        "null",
        "2024-01-31",
        "${not.an.interpolation}",
        "a \\${b} \\\\${c}",
        "",
        "multi\nline",
        "ünïcode",
        1e-10,
        -0.0,
        10**20,
        [],
        {},
    ],
)
def test_tricky_values_round_trip(tmp_path: Path, value: Any) -> None:
    data = {"value": value, "nested": {"list": [value]}}
    assert round_trip(tmp_path, data) == data


def test_dump_keeps_key_order_and_writes_block_yaml() -> None:
    text = dump_config({"zeta": 1, "alpha": {"b": [1, 2]}})
    assert text == "zeta: 1\nalpha:\n  b:\n  - 1\n  - 2\n"


def test_dump_accepts_tuples(tmp_path: Path) -> None:
    assert round_trip(tmp_path, {"shape": (1, 2)}) == {"shape": [1, 2]}


def test_importing_config_does_not_import_torch() -> None:
    code = "import torchloom.config, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_paths_and_numpy_scalars_are_written_as_plain_values(tmp_path: Path) -> None:
    """A Path or a numpy scalar in a config mapping (or in Trainer settings) was a bare
    yaml RepresenterError from the dump."""
    import numpy as np

    data = {"folder": Path("data/mnist"), "lr": np.float64(0.5), "n": [np.int64(3), np.bool_(1)]}
    assert round_trip(tmp_path, data) == {"folder": "data/mnist", "lr": 0.5, "n": [3, True]}


def test_a_value_a_config_cannot_hold_is_an_error_naming_its_key() -> None:
    from torchloom.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        dump_config({"training": {"optimizer": {"betas": [0.9, object()]}}})
    problem = caught.value.problems[0]
    assert problem.subject == "key 'training.optimizer.betas.1'"
    assert "is of type object" in problem.message and problem.suggestion
