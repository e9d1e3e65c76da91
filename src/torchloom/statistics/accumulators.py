"""Running loss statistics kept on the device, so a step never waits for the host.

A step only appends the detached loss tensor (no arithmetic, no sync); values are reduced
when a row is written — at the logging interval and at the end of an epoch — or every
`FOLD_EVERY` values to bound memory. Std is the population std of the per-batch values,
from running sums in float64.
"""

from __future__ import annotations

import math
from typing import Any

import torch

FOLD_EVERY = 1024


class RunningStats:
    """count, mean, min, max, std of a stream of scalar tensors."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._pending: list[torch.Tensor] = []
        self._totals: torch.Tensor | None = None  # [sum, sum of squares, min, max], float64
        self.count = 0

    def add(self, value: torch.Tensor) -> None:
        self._pending.append(value.detach() if value.requires_grad else value)
        self.count += 1
        if len(self._pending) >= FOLD_EVERY:
            self._fold()

    def _fold(self) -> None:
        if not self._pending:
            return
        values = torch.stack(self._pending).to(torch.float64)
        self._pending = []
        folded = torch.stack([values.sum(), (values * values).sum(), values.min(), values.max()])
        if self._totals is None:
            self._totals = folded
        else:
            old = self._totals
            self._totals = torch.stack(
                [
                    old[0] + folded[0],
                    old[1] + folded[1],
                    torch.minimum(old[2], folded[2]),
                    torch.maximum(old[3], folded[3]),
                ]
            )

    def values(self, prefix: str) -> dict[str, float]:
        """{prefix: mean, prefix_min, prefix_max, prefix_std}; empty when nothing was added."""
        self._fold()
        if self._totals is None or self.count == 0:
            return {}
        total, total_sq, low, high = self._totals.cpu().tolist()
        mean = total / self.count
        variance = max(total_sq / self.count - mean * mean, 0.0)
        return {
            prefix: mean,
            f"{prefix}_min": low,
            f"{prefix}_max": high,
            f"{prefix}_std": math.sqrt(variance),
        }

    def merge_state(self, state: dict[str, Any]) -> None:
        """Add another stream's `state_dict()` (several processes' batches, one pass)."""
        self._fold()
        other = state["totals"]
        if other is None:
            return
        other = other.to(torch.float64)
        if self._totals is None:
            self._totals = other.clone()
        else:
            own = self._totals
            self._totals = torch.stack(
                [
                    own[0] + other[0].to(own.device),
                    own[1] + other[1].to(own.device),
                    torch.minimum(own[2], other[2].to(own.device)),
                    torch.maximum(own[3], other[3].to(own.device)),
                ]
            )
        self.count += int(state["count"])

    def state_dict(self) -> dict[str, Any]:
        self._fold()
        return {"count": self.count, "totals": None if self._totals is None else self._totals.cpu()}

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        self.reset()
        self.count = int(state["count"])
        if state["totals"] is not None:
            self._totals = state["totals"].to(device)
