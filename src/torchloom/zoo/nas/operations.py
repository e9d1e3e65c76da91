"""DARTS's candidate operations (Liu, Simonyan & Yang 2019) and the blocks around them.

Every operation maps `channels` maps to `channels` maps, halving the resolution when its
stride is 2 (the edges of a reduction cell that leave its two input nodes). `affine` is off
during the search, as in the paper: a learned BatchNorm scale would let an operation's
weights compete with the architecture parameters that weigh it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

PRIMITIVES = (
    "none",
    "max_pool_3x3",
    "avg_pool_3x3",
    "skip_connect",
    "sep_conv_3x3",
    "sep_conv_5x5",
    "dil_conv_3x3",
    "dil_conv_5x5",
)


class ReLUConvBN(nn.Sequential):
    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, padding: int, affine: bool):
        super().__init__(
            nn.ReLU(),
            nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=padding, bias=False),
            nn.BatchNorm2d(c_out, affine=affine),
        )


class DilatedConv(nn.Sequential):
    """ReLU, a depthwise dilated convolution, a pointwise one, BatchNorm."""

    def __init__(self, c: int, kernel: int, stride: int, padding: int, dilation: int, affine: bool):
        super().__init__(
            nn.ReLU(),
            nn.Conv2d(c, c, kernel, stride, padding, dilation=dilation, groups=c, bias=False),
            nn.Conv2d(c, c, 1, bias=False),
            nn.BatchNorm2d(c, affine=affine),
        )


class SeparableConv(nn.Sequential):
    """Two depthwise-separable convolutions in a row (the first one strided), as in DARTS."""

    def __init__(self, c: int, kernel: int, stride: int, padding: int, affine: bool):
        super().__init__(
            DilatedConv(c, kernel, stride, padding, 1, affine),
            DilatedConv(c, kernel, 1, padding, 1, affine),
        )


class Zero(nn.Module):
    """The `none` operation: zeros of the output's shape (its weight in a mixed operation is
    how strongly the search prefers no connection)."""

    def __init__(self, stride: int) -> None:
        super().__init__()
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :, :: self.stride, :: self.stride] * 0.0


class FactorizedReduce(nn.Module):
    """Halves the resolution without losing every other pixel: two strided 1x1 convolutions,
    the second shifted by one pixel, concatenated. Needs an even input size."""

    def __init__(self, c_in: int, c_out: int, affine: bool) -> None:
        super().__init__()
        self.relu = nn.ReLU()
        self.conv_1 = nn.Conv2d(c_in, c_out // 2, 1, stride=2, bias=False)
        self.conv_2 = nn.Conv2d(c_in, c_out - c_out // 2, 1, stride=2, bias=False)
        self.bn = nn.BatchNorm2d(c_out, affine=affine)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(x)
        return self.bn(torch.cat([self.conv_1(x), self.conv_2(x[:, :, 1:, 1:])], dim=1))


OPERATIONS: dict[str, Callable[[int, int, bool], nn.Module]] = {
    "none": lambda c, stride, affine: Zero(stride),
    "max_pool_3x3": lambda c, stride, affine: nn.MaxPool2d(3, stride=stride, padding=1),
    "avg_pool_3x3": lambda c, stride, affine: nn.AvgPool2d(
        3, stride=stride, padding=1, count_include_pad=False
    ),
    "skip_connect": lambda c, stride, affine: (
        nn.Identity() if stride == 1 else FactorizedReduce(c, c, affine)
    ),
    "sep_conv_3x3": lambda c, stride, affine: SeparableConv(c, 3, stride, 1, affine),
    "sep_conv_5x5": lambda c, stride, affine: SeparableConv(c, 5, stride, 2, affine),
    "dil_conv_3x3": lambda c, stride, affine: DilatedConv(c, 3, stride, 2, 2, affine),
    "dil_conv_5x5": lambda c, stride, affine: DilatedConv(c, 5, stride, 4, 2, affine),
}
assert tuple(OPERATIONS) == PRIMITIVES


def operation(name: str, channels: int, stride: int, affine: bool) -> nn.Module:
    return OPERATIONS[name](channels, stride, affine)


def drop_path(x: torch.Tensor, drop_probability: torch.Tensor) -> torch.Tensor:
    """Zero whole samples of an operation's output with this probability (a 0-dim tensor),
    scaling the kept ones so that the expectation is unchanged (Zoph et al. 2018's
    ScheduledDropPath)."""
    keep = 1.0 - drop_probability
    draws = torch.rand(x.shape[0], 1, 1, 1, device=x.device)
    return x * (draws < keep).to(x.dtype) / keep.to(x.dtype)


def drop_path_at(top: float, ramp_epochs: int | None, epoch: int) -> float:
    """Drop-path's probability in `epoch` (from 0): `top` throughout without a ramp, else
    raised linearly from 0 over `ramp_epochs` epochs, as the DARTS reference's train.py does
    (`drop_path_prob * epoch / epochs`), and `top` after them."""
    if ramp_epochs is None:
        return top
    return top * min(epoch, ramp_epochs) / ramp_epochs


class ScheduledDropPath(nn.Module):
    """Drop-path (in training) at the epoch's probability, held in a 0-dim buffer that
    `start_epoch` fills: a compiled network reads it when it runs. As a Python number changed
    every epoch it was a constant of the compiled graph, so each epoch compiled another, and
    after eight torch.compile gave up and the network ran eagerly. `active` (whether anything
    is dropped) changes at most once, after a ramp's first epoch: two graphs at most."""

    probability: torch.Tensor

    def __init__(self, top: float, ramp_epochs: int | None) -> None:
        super().__init__()
        self.top, self.ramp_epochs = top, ramp_epochs
        # Not saved: the epoch makes it again (start_epoch runs in a resumed run too).
        self.register_buffer("probability", torch.zeros(()), persistent=False)
        self.value, self.active = 0.0, False
        self.start_epoch(0)  # what forward drops until an epoch starts

    def start_epoch(self, epoch: int) -> None:
        self.value = drop_path_at(self.top, self.ramp_epochs, epoch)  # as a number, for reports
        with torch.no_grad():
            self.probability.fill_(self.value)
        self.active = self.value > 0

    def dropped(self, x: torch.Tensor) -> torch.Tensor:
        """`x` with whole samples dropped (in training). A method, not `forward`: called from
        every cell, as a module it would be one "layer" to the layer statistics' hooks,
        mixing every cell's outputs in one row."""
        return drop_path(x, self.probability) if self.training and self.active else x


def preprocessing(
    c_previous_previous: int, c_previous: int, channels: int, reduction_previous: bool, affine: bool
) -> tuple[nn.Module, nn.Module]:
    """The 1x1 blocks that bring a cell's two inputs to `channels` maps (and the older one to
    this cell's resolution when the previous cell halved it)."""
    first = (
        FactorizedReduce(c_previous_previous, channels, affine)
        if reduction_previous
        else ReLUConvBN(c_previous_previous, channels, 1, 1, 0, affine)
    )
    return first, ReLUConvBN(c_previous, channels, 1, 1, 0, affine)
