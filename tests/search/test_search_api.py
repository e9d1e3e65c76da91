"""`torchloom.search(...)`: a YAML config with a space given as a mapping, and a code-first
builder whose `hp.float` / `hp.int` / `hp.choice` calls are the space."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from search_helpers import tiny_config

import torchloom
from torchloom.config import load_config


def test_search_a_config_with_a_space_mapping(tmp_path: Path, mnist_folder: Path) -> None:
    config = tiny_config(tmp_path, mnist_folder)
    found = torchloom.search(
        config,
        space={"training.optimizer.lr": {"loguniform": [1.0e-4, 1.0e-2]}},
        trials=2,
        expdir=str(tmp_path / "runs"),
    )
    assert [row["state"] for row in found.trials] == ["complete", "complete"]
    assert found.best_value == max(row["validation.accuracy"] for row in found.trials)
    assert set(found.best_params) == {"training.optimizer.lr"}
    assert found.best_config is not None and found.best_config.is_file()
    assert (found.search_dir / "space.yml").is_file()  # kept for --resume


def test_search_a_code_first_builder(tmp_path: Path, mnist_folder: Path) -> None:
    base = load_config(tiny_config(tmp_path, mnist_folder)).data

    def build(hp: Any) -> dict[str, Any]:
        config = yaml.safe_load(yaml.safe_dump(base))  # a fresh copy per trial
        config["training"]["optimizer"]["lr"] = hp.float("lr", 1e-4, 1e-2, log=True)
        config["training"]["dataloader"]["batch_size"] = hp.int("batch", 16, 32, step=16)
        config["training"]["optimizer"]["type"] = hp.choice("optimizer", ["Adam", "SGD"])
        return config

    found = torchloom.search(build, trials=2, seed=0, expdir=str(tmp_path / "runs"))
    assert len(found.trials) == 2
    assert set(found.best_params) == {"lr", "batch", "optimizer"}
    assert found.best_config is not None
    best = yaml.safe_load(found.best_config.read_text())
    assert best["training"]["optimizer"]["type"] == found.best_params["optimizer"]
    assert best["training"]["dataloader"]["batch_size"] == found.best_params["batch"]
