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

from torchloom.core.host_copies import host_to_device

FOLD_EVERY = 1024


class RunningStats:
    """count, mean, min, max, std of a stream of scalar tensors. The mean weighs each value by
    its weight when one is given (a batch's loss by its samples: an epoch's loss is the mean
    over its samples, a short last batch counting for what it holds); min, max and std are
    over the values themselves."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._pending: list[torch.Tensor] = []
        self._weights: list[float] = []
        # [sum, sum of squares, min, max, weighted sum], float64
        self._totals: torch.Tensor | None = None
        self.count = 0
        self.weight = 0.0

    def add(self, value: torch.Tensor, weight: float = 1.0) -> None:
        self._pending.append(value.detach() if value.requires_grad else value)
        self._weights.append(float(weight))
        self.count += 1
        self.weight += float(weight)
        if len(self._pending) >= FOLD_EVERY:
            self._fold()

    def _fold(self) -> None:
        if not self._pending:
            return
        values = torch.stack(self._pending).to(torch.float64)
        weights = host_to_device(torch.tensor(self._weights, dtype=torch.float64), values.device)
        self._pending, self._weights = [], []
        folded = torch.stack(
            [
                values.sum(),
                (values * values).sum(),
                values.min(),
                values.max(),
                (values * weights).sum(),
            ]
        )
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
                    old[4] + folded[4],
                ]
            )

    def values(self, prefix: str) -> dict[str, float]:
        """{prefix: weighted mean, prefix_min, prefix_max, prefix_std}; empty when nothing was
        added."""
        self._fold()
        if self._totals is None or self.count == 0:
            return {}
        total, total_sq, low, high, weighted = self._totals.cpu().tolist()
        mean = total / self.count
        variance = max(total_sq / self.count - mean * mean, 0.0)
        return {
            prefix: weighted / self.weight if self.weight else mean,
            f"{prefix}_min": low,
            f"{prefix}_max": high,
            f"{prefix}_std": math.sqrt(variance),
        }

    def state_dict(self) -> dict[str, Any]:
        self._fold()
        totals = None if self._totals is None else self._totals.cpu()
        return {"count": self.count, "weight": self.weight, "totals": totals}

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        self.reset()
        self.count = int(state["count"])
        totals = state["totals"]
        if totals is not None and len(totals) == 4:  # saved before values had weights: 1 each
            totals = torch.cat([totals, totals[:1]])
        self.weight = float(state.get("weight", self.count))
        if totals is not None:
            self._totals = totals.to(device)
