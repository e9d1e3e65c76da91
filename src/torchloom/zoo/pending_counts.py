"""Step values that a counting statistic copies aside and counts later, many steps at once.

A statistic's update runs on every training step, where each tensor call costs more than its
arithmetic (on a GPU, a kernel launch from the host): counting a step as it comes takes ten
to twenty calls (comparisons, masks, index_add_, the sums), copying its values aside takes
one per value. So a step copies what it needs (its argmax, targets, groups) into int64
columns made once, and the statistic counts the filled part in a few calls when the columns
are full or its counts are read (compute, merge, a checkpoint). Copies, not the step's
tensors: a CUDA graph's next replay would overwrite its outputs, and on the CPU small tensors
kept for many steps beside each batch's images left the heap in pieces, so that every new
batch took fresh, zeroed pages (benchmarks/host_step.py: 0.5 ms a step of 256 images).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torchloom.core.component import Batch, Statistic

# How much is left to count together: this many steps of the first batch's size, and at most
# this many values a column (8 MB of int64 for long sequences).
PENDING_STEPS = 64
PENDING_VALUES = 1 << 20


class PendingColumns:
    """Int64 columns, one per value a step gives for each of its samples (or tokens), that the
    steps are copied into until the owner counts them."""

    def __init__(self, columns: int) -> None:
        self.columns = [torch.zeros(0, dtype=torch.int64) for _ in range(columns)]
        self.filled = 0

    def reserve(
        self, count: int, device: torch.device, count_pending: Callable[[], None]
    ) -> list[torch.Tensor]:
        """`count` places in each column, after the filled ones; when they do not fit or are
        on another device, `count_pending` (the owner's counting, which calls `take`) first,
        and new columns where these are too small or elsewhere."""
        if self.filled + count > len(self.columns[0]) or self.columns[0].device != device:
            count_pending()
            assert self.filled == 0, "count_pending must take the pending values"
            if count > len(self.columns[0]) or self.columns[0].device != device:
                size = max(count, min(count * PENDING_STEPS, PENDING_VALUES))
                # Ordinary tensors even when made under torch.inference_mode (an evaluation
                # pass), so that a later training step may write into them.
                with torch.inference_mode(False):
                    self.columns = [
                        torch.empty(size, dtype=torch.int64, device=device) for _ in self.columns
                    ]
        start = self.filled
        self.filled = start + count
        return [column[start : self.filled] for column in self.columns]

    def take(self) -> list[torch.Tensor] | None:
        """The filled part of each column, to be counted now (the next step writes over it);
        None when nothing waits."""
        filled, self.filled = self.filled, 0
        return [column[:filled] for column in self.columns] if filled else None

    def clear(self) -> None:
        self.filled = 0


class CountedLater(Statistic):
    """A statistic whose steps wait in PendingColumns: `count_pending` counts them into the
    statistic's buffers, which are all counts; reading or replacing the buffers through a
    state dict (a checkpoint, the counts sent to another process) counts them first, and so
    does adding another copy's (`merge`)."""

    def count_pending(self) -> None:
        raise NotImplementedError

    def upgrade_saved_counts(self, state_dict: dict[str, Any], prefix: str) -> None:
        """Rewrite, in place, counts an older version saved under other names (before they
        are loaded); nothing by default."""

    def merge(self, other: Statistic) -> None:
        assert type(other) is type(self)
        assert isinstance(other, CountedLater)
        self.count_pending()
        other.count_pending()
        self.add_buffers_of(other)

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        self.count_pending()
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        errors: list[str],
    ) -> None:
        self.upgrade_saved_counts(state_dict, prefix)
        self.count_pending()  # then replaced by the loaded counts where they are saved
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors
        )


class CountsChoices(CountedLater):
    """A statistic of the chosen classes (the argmax over the last dimension of
    `predictions`) against `targets`, of any shape (a sequence's [batch, steps] too): each
    step sets both aside in two columns (`self._pending`, made by the subclass), and
    `count_choices` counts the steps set aside, flat, when they are counted."""

    _pending: PendingColumns

    def update(self, inputs: Batch) -> None:
        # Every training step: two copies, counted later.
        targets = inputs["targets"]
        columns = self._pending.reserve(targets.numel(), targets.device, self.count_pending)
        chosen, goals = columns[0], columns[1]
        if targets.dim() != 1:
            chosen, goals = chosen.view(targets.shape), goals.view(targets.shape)
        goals.copy_(targets)
        torch.argmax(inputs["predictions"], dim=-1, out=chosen)

    def count_pending(self) -> None:
        pending = self._pending.take()
        if pending is not None:
            self.count_choices(pending[0], pending[1])

    def count_choices(self, chosen: torch.Tensor, targets: torch.Tensor) -> None:
        raise NotImplementedError
