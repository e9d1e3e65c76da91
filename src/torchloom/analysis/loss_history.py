"""The per-sample losses of one analysed output across epochs, by sample id, for the
worst-samples report (worst_samples.py): a [epochs, samples] tensor, NaN where a sample was not
seen, and each sample's target and last prediction; never outputs. The row being written lives
on the device (the steps write it there without waiting); the rows of passes that ended are
kept on the host, so a long run's history takes one row of the GPU's memory, not one per
epoch (ImageNet: 5 MB an epoch)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from torchloom.analysis.schema import OutputSpec
from torchloom.core.component import Batch


class LossHistory:
    """Per-sample losses of one output: `history` [epochs, samples], NaN where a sample was
    not seen; `labels` numbers the rows (the epoch each one belongs to)."""

    def __init__(self, output: OutputSpec, size: int, device: torch.device) -> None:
        self.output = output
        self.device = device
        self.kept = torch.empty(0, size)  # on the host: every row, the open one as last synced
        self.open: tuple[int, torch.Tensor] | None = None  # (epoch, its row on the device)
        self.labels: list[int] = []
        self.targets = torch.full((size,), -1, dtype=torch.int64, device=device)
        self.predictions = torch.full((size,), -1, dtype=torch.int64, device=device)
        self.ids_problem: str | None = None  # decided at the first batch (see problem)
        self.ids_checked = False

    @property
    def size(self) -> int:
        return int(self.kept.shape[1])

    @property
    def history(self) -> torch.Tensor:
        """[epochs, samples] on the host: the open row copied in as written so far."""
        self._keep_open_row()
        return self.kept

    def _keep_open_row(self) -> None:
        if self.open is not None:
            epoch, row = self.open
            self.kept[epoch].copy_(row)

    def blank_row(self) -> torch.Tensor:
        return torch.full((self.size,), float("nan"), device=self.device)

    def add_row(self, row: torch.Tensor, label: int) -> None:
        """A pass that ended (a validation pass, or a training epoch skipped): kept on the
        host. A copy per epoch (not per step) keeps the tensor exactly [epochs, samples]."""
        self.kept = torch.cat([self.kept, row.detach().cpu().unsqueeze(0)])
        self.labels.append(label)

    def row_for_epoch(self, epoch: int) -> torch.Tensor:
        """The row of a training epoch (0-based) on the device, added (with any skipped ones)
        when new; the row it was writing before goes to the host."""
        if self.open is not None and self.open[0] == epoch:
            return self.open[1]
        self._keep_open_row()
        while len(self.labels) <= epoch:
            self.add_row(torch.full((self.size,), float("nan")), len(self.labels) + 1)
        self.open = (epoch, self.kept[epoch].to(self.device, copy=True))
        return self.open[1]

    def row(self, epoch: int) -> torch.Tensor | None:
        """Epoch `epoch`'s row where it is written (the device's for the open one), or None."""
        if self.open is not None and self.open[0] == epoch:
            return self.open[1]
        return self.kept[epoch] if 0 <= epoch < len(self.labels) else None

    def problem(self, batch: Batch) -> str | None:
        """Why this batch cannot be tracked: checked on shapes, and the ids' values at the first
        batch only (one host read in the run)."""
        out = self.output
        missing = [s for s in (out.predictions, out.targets, out.ids) if s not in batch]
        if missing:
            return f"the batch has no stream {', '.join(missing)}"
        predictions, targets, ids = batch[out.predictions], batch[out.targets], batch[out.ids]
        if not all(isinstance(t, torch.Tensor) for t in (predictions, targets, ids)):
            return "its streams are not tensors"
        if predictions.ndim != 2 or targets.ndim != 1 or ids.ndim != 1:
            return (
                f"predictions must be [batch, classes] and targets and ids [batch], got "
                f"{list(predictions.shape)}, {list(targets.shape)}, {list(ids.shape)}"
            )
        if not self.ids_checked and ids.numel():
            # Ids outside the split (a stream of other ids than positions) index past the
            # history: on a GPU a device-side assert, after which nothing, last.pt included,
            # can be saved. Checked once: the ids are the same kind of value in every batch.
            self.ids_checked = True
            low, high = (int(v) for v in torch.stack([ids.min(), ids.max()]).tolist())
            if low < 0 or high >= self.size:
                self.ids_problem = (
                    f"its ids stream '{out.ids}' holds {low} to {high}, not positions in the "
                    f"split (0 to {self.size - 1}): name the task's sample positions (indices)"
                )
        return self.ids_problem

    def observe(self, batch: Batch, row: torch.Tensor) -> None:
        """Write the batch's per-sample losses into `row` by sample id (device only)."""
        out = self.output
        self.observe_block(batch[out.predictions], batch[out.targets], batch[out.ids], row)

    @torch.no_grad()
    def observe_block(
        self, scores: torch.Tensor, targets: torch.Tensor, ids: torch.Tensor, row: torch.Tensor
    ) -> None:
        """`observe` for the samples of one batch or of a block of steps."""
        device = self.targets.device
        targets = targets.to(device, torch.int64, non_blocking=True)
        ids = ids.to(device, torch.int64, non_blocking=True)
        # A target outside the classes (a loss's ignore_index other than -100, say) has no
        # loss: NaN, so the sample counts as unseen; cross_entropy would raise (a device-side
        # assert on a GPU, after which nothing can be saved).
        inside = (targets >= 0) & (targets < scores.shape[1])
        losses = F.cross_entropy(
            scores.detach().float(), targets.where(inside, 0), reduction="none"
        ).masked_fill(~inside, float("nan"))
        # A sample seen twice in a block (a sampler with replacement, a reservoir) is written
        # with its last values at both places: which of repeated indices index_copy_ writes
        # last is not fixed on a GPU, and the loss, target and prediction could mix steps.
        last = last_occurrence(ids)
        row.index_copy_(0, ids, losses.to(row.dtype)[last])
        self.targets.index_copy_(0, ids, targets[last])
        self.predictions.index_copy_(0, ids, scores.argmax(dim=1)[last])

    def state_dict(self) -> dict[str, Any]:
        return {
            "history": self.history.clone(),
            "labels": list(self.labels),
            "targets": self.targets.cpu(),
            "predictions": self.predictions.cpu(),
        }

    def seen_in(self, row: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The samples `row` has a loss for: their ids, losses, targets, last predictions
        (on the host, for another process to `adopt`)."""
        ids = torch.nonzero(~torch.isnan(row)).flatten()
        return ids.cpu(), row[ids].cpu(), self.targets[ids].cpu(), self.predictions[ids].cpu()

    def adopt(self, row: torch.Tensor, seen: tuple[torch.Tensor, ...]) -> None:
        """Write another process's `seen_in` into `row` and the targets and predictions."""
        ids, losses, targets, predictions = seen
        row.index_copy_(0, ids.to(row.device), losses.to(row.device, row.dtype))
        ids = ids.to(self.device)
        self.targets.index_copy_(0, ids, targets.to(self.device))
        self.predictions.index_copy_(0, ids, predictions.to(self.device))

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Adopt a checkpoint's history; False when it was kept for another data set size."""
        history = state["history"]
        if history.ndim != 2 or history.shape[1] != self.size:
            return False
        self.kept, self.open = history.to("cpu", torch.float32, copy=True), None
        self.labels = [int(v) for v in state["labels"]]
        self.targets = state["targets"].to(self.device)
        self.predictions = state["predictions"].to(self.device)
        return True

    def hardest(self, count: int) -> list[dict[str, Any]]:
        """The `count` seen samples of highest cumulative loss, hardest first (reduced on the
        host, where the rows are kept)."""
        history = self.history
        seen = ~torch.isnan(history)
        ever_seen = seen.any(dim=0)
        cumulative = torch.nansum(history, dim=0).masked_fill(~ever_seen, float("-inf"))
        count = min(count, int(ever_seen.sum()))
        if count == 0:
            return []
        top, ids = torch.topk(cumulative, count)
        columns = history[:, ids].cpu()
        targets, predictions = self.targets[ids].cpu(), self.predictions[ids].cpu()
        rows = []
        for column, (i, total) in enumerate(zip(ids.tolist(), top.tolist(), strict=True)):
            losses = columns[:, column]
            latest = losses[~torch.isnan(losses)][-1]  # the last epoch it was seen in
            rows.append(
                {
                    "id": i,
                    "cumulative_loss": total,
                    "last_loss": float(latest),
                    "target": int(targets[column]),
                    "prediction": int(predictions[column]),
                }
            )
        return rows


def last_occurrence(ids: torch.Tensor) -> torch.Tensor:
    """For each position of `ids`, the last position holding the same id (on the device, no
    host sync)."""
    order = torch.sort(ids, stable=True).indices  # equal ids keep their positions' order
    in_order = ids[order]
    end_of_group = torch.searchsorted(in_order, in_order, right=True) - 1
    last = torch.empty_like(order)
    last[order] = order[end_of_group]
    return last
