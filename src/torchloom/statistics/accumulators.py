"""Running loss statistics kept on the device, so a step never waits for the host.

Values are read (one sync) only when a row is written: at the logging interval and at the
end of an epoch. Std is the population std of the per-batch values, computed from running
sums in float64.
"""

from __future__ import annotations

import math
from typing import Any

import torch


class RunningStats:
    """count, mean, min, max, std of a stream of scalar tensors."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._sum: torch.Tensor | None = None
        self._sum_sq: torch.Tensor | None = None
        self._min: torch.Tensor | None = None
        self._max: torch.Tensor | None = None
        self.count = 0

    def add(self, value: torch.Tensor) -> None:
        value = value.detach().to(torch.float64)
        if self._sum is None:
            self._sum, self._sum_sq = value.clone(), value * value
            self._min, self._max = value.clone(), value.clone()
        else:
            assert self._sum_sq is not None and self._min is not None and self._max is not None
            self._sum += value
            self._sum_sq += value * value
            self._min = torch.minimum(self._min, value)
            self._max = torch.maximum(self._max, value)
        self.count += 1

    def values(self, prefix: str) -> dict[str, float]:
        """{prefix: mean, prefix_min, prefix_max, prefix_std}; empty when nothing was added."""
        if self._sum is None or self.count == 0:
            return {}
        assert self._sum_sq is not None and self._min is not None and self._max is not None
        packed = torch.stack([self._sum, self._sum_sq, self._min, self._max]).cpu().tolist()
        total, total_sq, low, high = packed
        mean = total / self.count
        variance = max(total_sq / self.count - mean * mean, 0.0)
        return {
            prefix: mean,
            f"{prefix}_min": low,
            f"{prefix}_max": high,
            f"{prefix}_std": math.sqrt(variance),
        }

    def state_dict(self) -> dict[str, Any]:
        tensors = [self._sum, self._sum_sq, self._min, self._max]
        return {
            "count": self.count,
            "tensors": None if self._sum is None else [t.cpu() for t in tensors if t is not None],
        }

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        self.reset()
        self.count = int(state["count"])
        if state["tensors"] is not None:
            self._sum, self._sum_sq, self._min, self._max = (t.to(device) for t in state["tensors"])
