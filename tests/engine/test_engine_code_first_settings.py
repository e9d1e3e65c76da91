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
def test_a_seed_that_validates_as_an_int_is_the_seed_the_run_uses(tmp_path: Path, seed: Any) -> None:
    """Only a Python int was taken: the others passed validation, but the run drew and
    recorded a random seed."""
    result = torchloom.Trainer(epochs=1, seed=seed, expdir=tmp_path, analysis=False).fit(
        models.Clusters(), train=models.train_set
    )
    assert recorded(result)["training"]["seed"] == 5
