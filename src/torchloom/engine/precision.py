"""Mixed precision and the optimizer step: autocast, GradScaler (fp16), clipping.

bf16 needs no scaler; fp16 uses a GradScaler, which skips steps whose gradients overflow
(that is not divergence). Gradients are unscaled before clipping so thresholds mean what
they say.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    def __init__(
        self,
        mode: str,
        device: torch.device,
        clip_norm: float | None = None,
        clip_value: float | None = None,
        norm_type: float = 2.0,
    ) -> None:
        self.mode = mode
        self.device = device
        self.dtype = DTYPES.get(mode)
        self.scaler = torch.amp.GradScaler(device.type) if mode == "fp16" else None
        self.clip_norm, self.clip_value, self.norm_type = clip_norm, clip_value, norm_type

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.dtype is None:
            yield
            return
        with torch.autocast(self.device.type, dtype=self.dtype):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer, parameters: list[torch.nn.Parameter]) -> None:
        if self.scaler is not None and (self.clip_norm or self.clip_value):
            self.scaler.unscale_(optimizer)
        if self.clip_norm:
            torch.nn.utils.clip_grad_norm_(parameters, self.clip_norm, self.norm_type)
        if self.clip_value:
            torch.nn.utils.clip_grad_value_(parameters, self.clip_value)
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()

    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
