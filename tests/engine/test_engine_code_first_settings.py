"""Trainer settings: what `fit` records and uses is what the Trainer was given, validated, and
one Trainer's settings are not changed by a fit (nor by another Trainer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import code_first_models as models
import torchloom


def recorded(result: torchloom.RunResult) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((result.run_dir / "config.yaml").read_text())
    return config


@pytest.mark.parametrize("seed", [np.int64(5), 5.0, "5"])
def test_a_seed_that_validates_as_an_int_is_the_seed_the_run_uses(
    tmp_path: Path, seed: Any
) -> None:
    """Only a Python int was taken: the others passed validation, but the run drew and
    recorded a random seed."""
    result = torchloom.Trainer(epochs=1, seed=seed, expdir=tmp_path, analysis=False).fit(
        models.Clusters(), train=models.train_set
    )
    assert recorded(result)["training"]["seed"] == 5


def test_a_trainer_without_a_seed_resumes_with_the_run_s_seed(tmp_path: Path) -> None:
    """A Trainer without `seed` drew a new one on resume, which the resume check refused as a
    change of training.seed: resuming with default settings could not work."""
    first = torchloom.Trainer(epochs=1, expdir=tmp_path, analysis=False).fit(
        models.Clusters(), train=models.train_set
    )
    longer = torchloom.Trainer(epochs=2, expdir=tmp_path, analysis=False).fit(
        models.Clusters(), train=models.train_set, resume=first.run_dir
    )
    assert longer.run_dir == first.run_dir and longer.summary["epochs"] == 2
    assert longer.summary["seed"] == first.summary["seed"] == recorded(first)["training"]["seed"]
