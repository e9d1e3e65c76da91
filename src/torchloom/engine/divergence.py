"""Stopping a run whose loss turns NaN or infinite, within one step, naming the loss.

On the CPU the check is immediate (reading a CPU scalar costs nothing). On a GPU, reading the
loss every step would make the host wait for the device, so the finiteness flag is copied
asynchronously into pinned memory and read one step later: the run still stops within one
step, without a per-step synchronisation.
"""

from __future__ import annotations

import math

import torch

from torchloom.core.component import Batch
from torchloom.errors import LoomError, Problem


class Diverged(LoomError):
    headline = "training diverged"


class DivergenceGuard:
    def __init__(self, device: torch.device, loss_streams: list[str]) -> None:
        self.device = device
        self.streams = loss_streams
        self._pending: tuple[torch.Tensor, torch.cuda.Event, dict[str, torch.Tensor], int] | None
        self._pending = None

    def check(self, total: torch.Tensor, batch: Batch, episode: int) -> None:
        parts = {s: batch[s].detach() for s in self.streams}
        if self.device.type != "cuda":
            if not math.isfinite(float(total.detach())):
                self._raise(parts, episode)
            return
        if self._pending is not None:
            flag, event, previous, previous_episode = self._pending
            event.synchronize()
            if not bool(flag):
                self._raise(previous, previous_episode)
        flag = torch.empty((), dtype=torch.bool, pin_memory=True)
        flag.copy_(torch.isfinite(total.detach()), non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._pending = (flag, event, parts, episode)

    def _raise(self, parts: dict[str, torch.Tensor], episode: int) -> None:
        bad = [f"'{s}' = {float(v):g}" for s, v in parts.items() if not math.isfinite(float(v))]
        raise Diverged(
            [
                Problem(
                    "",
                    f"episode {episode}",
                    f"loss {', '.join(bad) or 'total'} is not finite",
                    "lower the learning rate, clip gradients "
                    "(training.gradient_clipping) or check the inputs",
                )
            ]
        )
