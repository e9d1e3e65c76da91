"""The misclassified samples of one output's validation or test pass: `<output>-<split>-errors.csv`.

One process streams them to a temporary CSV that becomes the report only when the pass
completes (a partial validation pass is dropped): memory does not grow with the data. Batches
wait on the device and are read `FLUSH` samples at a time, not one host sync per batch.

With several processes each sees its share of every batch (a contiguous slice, rank 0's
first: data/rank_shard.RankShard). Each keeps its share's rows, keyed by batch, and at the
pass's end rank 0 writes every process's rows in the order one process would have written
them (`merge_shares`); a sample without an id is numbered by its position in the whole pass.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from torchloom.data.atomic_files import PendingFile
from torchloom.data.csv_cells import safe_cell

ERROR_COLUMNS = ("id", "truth", "prediction", "confidence", "truth_name", "prediction_name")

# (batch number in the pass, position in this process's share of it, id or None, truth,
# prediction, confidence)
HeldRow = tuple[int, int, Any, int, int, float]


@dataclass
class ErrorShare:
    """One process's misclassified samples of a pass, and its share's size of every batch
    (from which an id-less sample's position in the pass follows)."""

    rows: list[HeldRow] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)


def _read_back(tensors: Sequence[torch.Tensor]) -> list[Any]:
    """The values of `tensors`, flattened and in order, read back to the host at once."""
    if not tensors:
        return []
    device = tensors[0].device
    return torch.cat([tensor.reshape(-1).to(device) for tensor in tensors]).cpu().tolist()


class ErrorStream:
    """The misclassified samples of one pass: streamed to the report `path`'s temporary file
    by one process; held as an `ErrorShare` by each of several (no `path`)."""

    FLUSH = 8192

    def __init__(self, names: Sequence[str], path: Path | None = None) -> None:
        self.names = names
        self.share: ErrorShare | None = ErrorShare() if path is None else None
        self.pending = None if path is None else PendingFile(path)
        # Rows gather as text and go to the file at each flush: dropping a pass (partial, or
        # cut short by an exception) then never has half-written text to flush first.
        self.text = io.StringIO(newline="")
        self.writer = csv.writer(self.text)
        self.writer.writerow(ERROR_COLUMNS)
        self.waiting: list[tuple[int, Any, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.batches = self.seen = self.flushed = 0

    def add(self, ids: Any, scores: torch.Tensor, targets: torch.Tensor) -> None:
        confidence, predicted = torch.softmax(scores.detach().float(), dim=1).max(dim=1)
        if ids is None and self.share is None:  # no id stream: the position in the pass
            ids = torch.arange(self.seen, self.seen + len(predicted))
        truth = targets.detach().reshape(-1)
        self.waiting.append((self.batches, ids, truth, predicted, confidence))
        if self.share is not None:
            self.share.sizes.append(len(predicted))
        self.batches += 1
        self.seen += len(predicted)
        if self.seen - self.flushed >= self.FLUSH:
            self.flush()

    def flush(self) -> None:
        # Each column of the waiting batches read back in one copy (from a GPU, a read is a
        # wait for its queue): four reads per flush, not four per batch.
        _, id_column, *columns = list(zip(*self.waiting, strict=True)) or [()] * 5
        truths, guesses, sures = (iter(_read_back(column)) for column in columns)
        tensor_ids = iter(_read_back([i for i in id_column if isinstance(i, torch.Tensor)]))
        for batch, ids, truth_tensor, *_ in self.waiting:
            count = len(truth_tensor)
            truth, guess, sure = (
                [next(values) for _ in range(count)] for values in (truths, guesses, sures)
            )
            if ids is None:
                names: list[Any] = [None] * count
            elif isinstance(ids, torch.Tensor):
                names = [next(tensor_ids) for _ in range(len(ids.reshape(-1)))]
            else:
                names = list(ids)
            rows = zip(names, truth, guess, sure, strict=True)
            for position, (sample, t, p, c) in enumerate(rows):
                if t == p or not 0 <= t < len(self.names):
                    continue
                if self.share is not None:
                    self.share.rows.append((batch, position, sample, t, p, c))
                else:
                    self.writer.writerow(error_line(sample, t, p, c, self.names))
        self.waiting, self.flushed = [], self.seen
        if self.pending is not None:
            self.pending.handle.write(self.text.getvalue().encode("utf-8"))
            self.text.seek(0)
            self.text.truncate()

    def finish(self, keep: bool) -> None:
        """End the pass: the report written (keep) or dropped. A held share is written by
        rank 0 once merged (`merge_shares`) instead."""
        if self.pending is None:
            return
        if keep:
            self.flush()
            self.pending.commit()
        else:
            self.pending.discard()

    def held_share(self) -> ErrorShare | None:
        """The rows this process held for the merge (None: one process streamed them)."""
        if self.share is not None:
            self.flush()
        return self.share


def error_line(sample: Any, t: int, p: int, c: float, names: Sequence[str]) -> tuple[Any, ...]:
    return (safe_cell(sample), t, p, f"{c:.6f}", safe_cell(names[t]), safe_cell(names[p]))


def merge_shares(shares: Sequence[ErrorShare | None]) -> list[tuple[Any, int, int, float]]:
    """Every process's rows of a pass (in rank order; None: a process that had no batch of
    it) as (id, truth, prediction, confidence), in the order one process meets them: batch by
    batch, and within a batch rank 0's share first."""
    present = [(rank, share) for rank, share in enumerate(shares) if share is not None]
    batches = max((len(share.sizes) for _, share in present), default=0)
    first: dict[tuple[int, int], int] = {}  # (batch, rank) -> position of its share's first
    position = 0
    for batch in range(batches):
        for rank, share in present:
            first[batch, rank] = position
            position += share.sizes[batch] if batch < len(share.sizes) else 0
    keyed = [
        ((batch, rank, where), (first[batch, rank] + where if sample is None else sample, t, p, c))
        for rank, share in present
        for batch, where, sample, t, p, c in share.rows
    ]
    keyed.sort(key=lambda item: item[0])
    return [row for _, row in keyed]
