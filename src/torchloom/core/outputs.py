"""What a plain `nn.Module` returns to be trained by torchloom without a YAML pipeline.

    class Net(nn.Module):
        def forward(self, batch):
            logits = self.body(batch["inputs"])
            return {"digits": outputs.Classification(logits, target="targets")}

Each declared output becomes a stream of that name; the engine adds the loss (and, for
classification, the accuracy) that the kind of output implies, so the same run folder,
statistics and checkpoints as a YAML pipeline come out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch


@dataclass
class Output:
    """Base: a tensor with a batch dimension first."""

    value: torch.Tensor


@dataclass
class Classification(Output):
    """Class scores (logits) [batch, classes] trained with cross entropy against `target`,
    a stream of class indices [batch]; accuracy is reported as `accuracy` (with several
    Classification outputs, as `<name>_accuracy.accuracy`)."""

    target: str = "targets"
    weight: float = 1.0
    ignore_index: int = -100
    label_smoothing: float = 0.0


@dataclass
class Regression(Output):
    """Predictions trained against the same-shaped float stream `target`."""

    target: str = "targets"
    weight: float = 1.0
    loss: Literal["mse", "l1", "smooth_l1"] = "mse"


@dataclass
class Embedding(Output):
    """Vectors [batch, dims] kept as a stream (no loss), e.g. for later analysis."""
