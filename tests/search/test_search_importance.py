"""Parameter importance as a search computes it ranks a synthetic objective right:
loss = 3x + 2y + z + 0w over 200 random trials gives x > y > z > w (PED-ANOVA and fANOVA)."""

from __future__ import annotations

import optuna
import pytest

from torchloom.search.results import importance


@pytest.mark.parametrize("evaluator", ["ped-anova", "fanova"])
def test_importance_ranks_a_synthetic_objective(evaluator: str) -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))

    def objective(trial: optuna.Trial) -> float:
        x, y, z, w = (trial.suggest_float(name, 0, 1) for name in "xyzw")
        return 3 * x + 2 * y + z + 0 * w

    study.optimize(objective, n_trials=200)
    scores, note = importance(study, evaluator)
    assert note == evaluator
    assert sorted(scores, key=lambda name: -scores[name]) == ["x", "y", "z", "w"]


def test_importance_needs_completed_trials() -> None:
    study = optuna.create_study()
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=2)
    assert importance(study) == ({}, "needs 3 completed trials or more (2 so far)")
