"""A module and dataset factories in an importable file (tests/ is on sys.path), as a user's
package would hold them: what `loom process` of a code-first run builds again."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from torchloom import outputs


def clusters(n: int, seed: int) -> TensorDataset:
    """Three well-separated Gaussian clusters in 8 dimensions."""
    generator = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, 3, (n,), generator=generator)
    centres = torch.eye(3, 8) * 4
    inputs = centres[targets] + torch.randn(n, 8, generator=generator)
    return TensorDataset(inputs, targets)


def train_set() -> TensorDataset:
    return clusters(192, 0)


def validation_set() -> TensorDataset:
    return clusters(64, 1)


def test_set() -> TensorDataset:
    return clusters(96, 2)


class Clusters(nn.Module):
    """A Lazy MLP whose width is a constructor argument, recorded in `hparams`."""

    def __init__(self, width: int = 16, classes: int = 3) -> None:
        super().__init__()
        self.hparams: dict[str, Any] = {"width": width, "classes": classes}
        self.body = nn.Sequential(nn.LazyLinear(width), nn.ReLU(), nn.LazyLinear(classes))

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, outputs.Output]:
        return {"cluster": outputs.Classification(self.body(batch["inputs"]))}


class Unrecorded(Clusters):
    """The same module without `hparams`: its constructor's arguments are unknown."""

    def __init__(self, width: int = 16) -> None:
        super().__init__(width)
        del self.hparams


def _drawn(n: int) -> TensorDataset:
    """Clusters drawn from the global random generator (no generator of its own)."""
    targets = torch.randint(0, 3, (n,))
    return TensorDataset(torch.eye(3, 8)[targets] + torch.randn(n, 8), targets)


def drawn_train_set() -> TensorDataset:
    return _drawn(64)


def drawn_validation_set() -> TensorDataset:
    return _drawn(32)


def drawn_test_set() -> TensorDataset:
    return _drawn(32)


class PartlyRecorded(Clusters):
    """`hparams` without a defaulted argument (`classes`): a rebuild would take its default."""

    def __init__(self, width: int = 16, classes: int = 3) -> None:
        super().__init__(width, classes)
        self.hparams = {"width": width}
