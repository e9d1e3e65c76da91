"""Trainer settings: what `fit` records and uses is what the Trainer was given, validated, and
one Trainer's settings are not changed by a fit (nor by another Trainer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from torch import nn

import code_first_models as models
import torchloom
from torchloom import outputs
from torchloom.errors import ConfigError


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


class TwoHeads(nn.Module):
    def __init__(self, weight: float = 1.0) -> None:
        super().__init__()
        self.hparams = {"weight": weight}
        self.a, self.b = nn.LazyLinear(3), nn.LazyLinear(3)

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, outputs.Output]:
        return {
            "a": outputs.Classification(self.a(batch["inputs"]), weight=self.hparams["weight"]),
            "b": outputs.Classification(self.b(batch["inputs"])),
        }


def test_a_fit_leaves_the_trainer_s_settings_as_they_were(tmp_path: Path) -> None:
    """fit wrote the loss weights of its module into the Trainer: a second fit kept the first
    module's weights (5.0 was recorded as 1.0) and a fit of another module was refused for
    loss weights naming losses it does not have."""
    trainer = torchloom.Trainer(epochs=1, batch_size=64, seed=1, expdir=tmp_path, analysis=False)
    trainer.fit(TwoHeads(1.0), train=models.train_set)
    second = trainer.fit(TwoHeads(5.0), train=models.train_set)
    assert recorded(second)["training"]["loss_weights"] == {"a_loss": 5.0, "b_loss": 1.0}
    other = trainer.fit(models.Clusters(), train=models.train_set)
    assert recorded(other)["training"]["loss_weights"] == {"cluster_loss": 1.0}


def test_the_trainer_copies_the_mappings_it_is_given(tmp_path: Path) -> None:
    """The constructor filled the caller's own dicts: a `dataloader=` mapping shared by two
    Trainers took the first one's batch size into the second."""
    shared: dict[str, Any] = {"shuffle": False}
    torchloom.Trainer(epochs=1, batch_size=8, dataloader=shared, terminal_conditions={})
    assert shared == {"shuffle": False}
    trainer = torchloom.Trainer(epochs=1, dataloader=shared, seed=1, expdir=tmp_path)
    assert trainer.training["dataloader"]["batch_size"] == 64


@pytest.mark.parametrize(
    ("settings", "subject"),
    [
        ({"batch_size": 8, "dataloader": {"batch_size": 32}}, "Trainer(batch_size=8)"),
        ({"epochs": 3, "terminal_conditions": {"epoch_limit": 1}}, "Trainer(epochs=3)"),
        ({"task": {"type": "MNIST"}}, "Trainer(task=...)"),
    ],
)
def test_conflicting_or_unused_settings_are_refused(
    tmp_path: Path, settings: dict[str, Any], subject: str
) -> None:
    """One setting given twice with two values took one silently, and `task` was recorded in
    config.yaml though the run trains on the datasets given to fit."""
    with pytest.raises(ConfigError) as caught:
        torchloom.Trainer(expdir=tmp_path, **settings)
    assert caught.value.problems[0].subject == subject
    assert caught.value.problems[0].suggestion


def test_online_mode_validates_part_of_the_validation_set_and_needs_one(tmp_path: Path) -> None:
    """The validation section was a plain SectionConfig, so `mode="online"` failed with a bare
    AssertionError after the run folder was made; without validation data it was no error."""
    trainer = torchloom.Trainer(
        epochs=1, batch_size=32, mode="online", logging_interval=2, seed=0, expdir=tmp_path
    )
    result = trainer.fit(
        models.Clusters(), train=models.train_set, validation=models.validation_set
    )
    assert result.status == "epoch_limit"
    assert recorded(result)["validation"]["partial_validation_batches"] == 10
    with pytest.raises(ConfigError) as caught:
        torchloom.Trainer(epochs=1, mode="online", expdir=tmp_path / "none").fit(
            models.Clusters(), train=models.train_set
        )
    assert caught.value.problems[0].subject == "Trainer(mode='online')"
    assert "fit(..., validation=...)" in str(caught.value)
    assert not (tmp_path / "none").exists()


def test_an_online_trainer_sets_its_partial_validations(tmp_path: Path) -> None:
    """Online mode validated 10 batches every logging interval, and the Trainer had no way to
    say otherwise (a config says it under `validation:`)."""
    trainer = torchloom.Trainer(
        epochs=1,
        batch_size=16,
        mode="online",
        partial_validation_interval=3,
        partial_validation_batches=1,
        eval_batch_size=8,
        seed=0,
        expdir=tmp_path,
        analysis=False,
    )
    result = trainer.fit(
        models.Clusters(),
        train=models.train_set,
        validation=models.validation_set,
        test=models.test_set,
    )
    config = recorded(result)
    assert config["validation"]["partial_validation_interval"] == 3
    assert config["validation"]["partial_validation_batches"] == 1
    assert config["validation"]["dataloader"]["batch_size"] == 8
    assert config["test"]["dataloader"]["batch_size"] == 8
    rows = (result.run_dir / "validation_statistics.csv").read_text().splitlines()
    assert [row.split(",")[1] for row in rows[1:]] == ["3", "6", "9", "12"]  # episodes
    assert {row.split(",")[-1] for row in rows[1:]} == {"8"}  # one batch of 8 samples
    with pytest.raises(ConfigError, match="add mode='online'"):
        torchloom.Trainer(partial_validation_batches=2, expdir=tmp_path)
    with pytest.raises(ConfigError, match=r"Trainer\(eval_batch_size=...\): must be a whole"):
        torchloom.Trainer(eval_batch_size=0, expdir=tmp_path)
    taken = torchloom.Trainer(eval_batch_size=np.int64(8), expdir=tmp_path)  # as batch_size
    assert taken.evaluation["test"] == {"dataloader": {"batch_size": 8}}


@pytest.mark.parametrize("test", [None, models.test_set])
def test_the_module_holds_best_pt_after_a_test_pass_and_the_last_weights_without(
    tmp_path: Path, test: Any
) -> None:
    """What the user guide says the module holds after fit (the test pass loads best.pt)."""
    module = models.Clusters()
    result = torchloom.Trainer(
        epochs=3,
        batch_size=32,
        seed=1,
        expdir=tmp_path,
        analysis=False,
        optimizer={"type": "SGD", "lr": 10.0},  # so large that epoch 1 is the best
    ).fit(module, train=models.train_set, validation=models.validation_set, test=test)
    assert result.summary["monitor"]["best_epoch"] == 1 and result.summary["epochs"] == 3
    held = "best.pt" if test is not None else "last.pt"
    saved = torch.load(result.run_dir / "checkpoints" / held, weights_only=False)
    weights = saved["components"]["model"]
    state = module.state_dict()
    assert all(torch.equal(state[k.removeprefix("module.")].cpu(), v) for k, v in weights.items())
