"""The quantity training minimises: the weighted sum of every loss component's output."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from torchloom.core.component import Batch
from torchloom.core.pipeline import Pipeline
from torchloom.errors import ConfigError, Problem, did_you_mean


class WeightedLoss:
    def __init__(
        self, pipeline: Pipeline, weights: Mapping[str, float], where: Callable[..., str]
    ) -> None:
        names = [loss.name for loss in pipeline.losses]
        problems = [
            Problem(
                where("training", "loss_weights"),
                f"loss_weights '{name}'",
                "names no loss component",
                did_you_mean(name, names),
            )
            for name in weights
            if name not in names
        ]
        if problems:
            raise ConfigError(problems)
        # (stream the loss is published on, its weight)
        self.terms = [
            (loss.stream_name("loss"), float(weights.get(loss.name, 1.0)))
            for loss in pipeline.losses
        ]

    @property
    def streams(self) -> list[str]:
        return [stream for stream, _ in self.terms]

    def __call__(self, batch: Batch) -> torch.Tensor:
        total: torch.Tensor | None = None
        for stream, weight in self.terms:
            term = batch[stream] if weight == 1.0 else weight * batch[stream]
            total = term if total is None else total + term
        assert total is not None, "the handshake guarantees a loss in training"
        return total


def batch_size_of(batch: Batch) -> int:
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            return int(value.shape[0])
        if isinstance(value, list):
            return len(value)
    return 0
