"""Training-step tensors gathered and handed over in blocks, not one step at a time.

Per-step analysis (confusion counts, per-sample losses) is a handful of small kernels. On a
CPU, the fixed cost of launching them on a 64-sample batch is most of their cost, and it was
most of what the analysis added to an epoch. Holding the detached step tensors and working on
a block of steps at once does the same arithmetic with a fraction of the launches:

    buffer = StepBuffer(lambda scores, targets: counts.add(scores, targets))
    buffer.add(scores, targets)   # every step: two list appends
    buffer.flush()                # before the results are read (pass end, checkpoint)

Memory stays bounded: a block is handed over after `steps` steps or once it holds
`elements` values, whichever comes first (a language model's [batch, vocabulary] scores
fill it in a few steps). Only tensors are kept, and they stay on their device: no host sync.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class StepBuffer:
    def __init__(
        self,
        consume: Callable[..., None],
        steps: int = 32,
        elements: int = 1 << 20,
    ) -> None:
        self.consume = consume
        self.steps, self.elements = steps, elements
        self.fields: list[list[torch.Tensor]] = []
        self.held = 0

    def __len__(self) -> int:
        return len(self.fields[0]) if self.fields else 0

    def add(self, *tensors: torch.Tensor) -> None:
        """Keep a copy of one step's tensors: detached (a block never holds an autograd
        graph) and cloned, because the next step may write over the originals (a model
        compiled with CUDA graphs reuses its output memory; a component may work in place)."""
        if not self.fields:
            self.fields = [[] for _ in tensors]
        for field, tensor in zip(self.fields, tensors, strict=True):
            field.append(tensor.detach().clone())
        self.held += sum(t.numel() for t in tensors)
        if len(self) >= self.steps or self.held >= self.elements:
            self.flush()

    def flush(self) -> None:
        """Hand the held steps over as one block (each field concatenated along dim 0)."""
        if not len(self):
            return
        fields, self.fields, self.held = self.fields, [], 0
        self.consume(*(torch.cat(field) for field in fields))
