"""What a code-first user gets wrong is a ConfigError naming the fit argument and what to do,
never a bare traceback from deep inside, and nothing is written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import code_first_models as models
import torchloom
from torchloom import outputs
from torchloom.errors import ConfigError


class Stream(IterableDataset[Any]):
    def __iter__(self) -> Iterator[Any]:
        yield torch.zeros(8), torch.tensor(0)


@pytest.mark.parametrize(
    ("train", "subject", "message"),
    [
        (DataLoader(models.clusters(8, 0)), "fit(train=...)", "Trainer(batch_size=...)"),
        (Stream(), "fit(train=...)", "map-style"),
        (TensorDataset(torch.zeros(0, 8), torch.zeros(0)), "fit(train=...)", "no samples"),
        (None, "fit(train=...)", "the training data"),
    ],
)
def test_data_fit_cannot_use_is_refused_naming_the_argument(
    tmp_path: Path, train: Any, subject: str, message: str
) -> None:
    """A DataLoader was 'not subscriptable', an IterableDataset or an empty one an IndexError,
    and train=None a StopIteration."""
    with pytest.raises(ConfigError) as caught:
        torchloom.Trainer(epochs=1, expdir=tmp_path).fit(models.Clusters(), train=train)
    assert caught.value.problems[0].subject == subject
    assert message in str(caught.value)
    assert not any(tmp_path.iterdir())


def test_a_stream_forward_reads_that_the_batch_lacks_lists_the_streams(tmp_path: Path) -> None:
    class Misnamed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.LazyLinear(3)

        def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, outputs.Output]:
            return {"y": outputs.Classification(self.body(batch["images"]))}

    with pytest.raises(ConfigError) as caught:
        torchloom.Trainer(epochs=1, expdir=tmp_path).fit(Misnamed(), train=models.train_set)
    message = str(caught.value)
    assert "reads the stream 'images'" in message
    assert "inputs, targets, indices" in message
    assert not any(tmp_path.iterdir())


def test_numpy_values_in_trainer_settings_are_recorded_as_numbers(tmp_path: Path) -> None:
    """They were a bare yaml RepresenterError when config.yaml was written."""
    result = torchloom.Trainer(
        epochs=1,
        seed=0,
        expdir=tmp_path,
        analysis=False,
        optimizer={"type": "Adam", "lr": np.float64(0.01), "betas": [np.float32(0.5), 0.9]},
    ).fit(models.Clusters(), train=models.train_set)
    config = yaml.safe_load((result.run_dir / "config.yaml").read_text())
    assert config["training"]["optimizer"]["betas"] == [0.5, 0.9]


def test_a_validation_set_the_module_cannot_take_is_refused_before_training(
    tmp_path: Path,
) -> None:
    """A validation set of another width trained a whole epoch, then failed with torch's
    bare RuntimeError (the dry run read the training samples only)."""
    narrow = TensorDataset(torch.zeros(6, 5), torch.zeros(6, dtype=torch.long))
    with pytest.raises(ConfigError) as caught:
        torchloom.Trainer(epochs=1, expdir=tmp_path).fit(
            models.Clusters(), train=models.train_set, validation=narrow
        )
    assert caught.value.problems[0].subject == "the validation data"
    assert "cannot go through Clusters" in str(caught.value)
    assert not any(tmp_path.iterdir())


def test_the_dry_run_leaves_a_pretrained_module_s_batch_norm_statistics_alone(
    tmp_path: Path,
) -> None:
    """It ran in training mode: BatchNorm's running statistics moved before training did."""

    class Normalised(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.BatchNorm1d(8)
            self.kept = nn.Dropout()
            self.head = nn.Linear(8, 3)

        def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, outputs.Output]:
            features = self.kept(self.norm(batch["inputs"]))
            return {"y": outputs.Classification(self.head(features))}

    from torchloom.engine.code_first_pipeline import build_pipeline

    module = Normalised()
    module.kept.eval()  # a part the user keeps in eval mode stays so
    before = module.norm.running_mean.clone()
    build_pipeline(module, {"training": models.train_set()})
    assert torch.equal(module.norm.running_mean, before)
    assert module.training and module.norm.training and not module.kept.training
