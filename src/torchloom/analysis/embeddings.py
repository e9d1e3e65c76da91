"""Embeddings to the TensorBoard projector: chosen streams [batch, dims] of the final
evaluation pass, labelled with their classes and, when the output names an images stream,
shown as thumbnails.

    analysis:
      embeddings: {streams: [feature_vectors], section: validation, max_samples: 1000}
      outputs: [{images: inputs}]          # thumbnails (optional)

Which validation pass is the last is known only when the run ends (early stopping), so every
full pass of the section collects its first `max_samples` rows on the CPU and replaces the
previous pass's; `after_train` writes the last one. Only those rows are copied, and only until
they are complete: a pass costs a few small copies, the rest of it nothing. Partial passes
(online training) are dropped.

With several processes the hook runs in each, which keeps the first `max_samples` rows of its
share of the pass; at the pass's end rank 0 takes every process's, in the order one process
meets them (batch by batch, rank 0's share of a batch first), and keeps the first
`max_samples`: the points one process would export.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from torchloom.analysis.image_grid import class_names
from torchloom.analysis.schema import AnalysisConfig, EmbeddingsConfig
from torchloom.analysis.skipped import say_skipped
from torchloom.core.component import Batch
from torchloom.engine.distributed import SINGLE, Distributed
from torchloom.engine.state import Hook

if TYPE_CHECKING:
    from torchloom.engine.state import RunView

THUMBNAIL = 32  # pixels a side, at most: a sprite of 1000 of them stays about 1000 px wide


@dataclass
class _Part:
    """The rows kept from one batch (this process's share of it), on the CPU."""

    batch: int  # its number in the pass
    rows: int
    streams: dict[str, torch.Tensor]
    targets: torch.Tensor | None
    images: torch.Tensor | None


def _joined(values: list[torch.Tensor | None]) -> torch.Tensor | None:
    """The parts' rows of one kind, joined; None when a part lacks them (or there is none)."""
    present = [value for value in values if value is not None]
    return torch.cat(present) if present and len(present) == len(values) else None


@dataclass
class _Pass:
    """The rows kept from one evaluation pass, batch by batch."""

    parts: list[_Part] = field(default_factory=list)
    batches: int = 0  # batches of the pass seen so far

    @property
    def rows(self) -> int:
        return sum(part.rows for part in self.parts)

    def joined(self, stream: str) -> torch.Tensor | None:
        """The stream's rows of every part; None when a part lacks it."""
        return _joined([part.streams.get(stream) for part in self.parts])

    @staticmethod
    def merged(passes: list[_Pass], limit: int) -> _Pass:
        """Several processes' rows of one pass, in the order one process meets them, cut to
        the first `limit` (each process kept its first `limit`: enough for the whole's)."""
        keyed = [
            (part.batch, rank, part) for rank, kept in enumerate(passes) for part in kept.parts
        ]
        whole, left = _Pass(), limit
        for _, _, part in sorted(keyed, key=lambda item: item[:2]):
            if left <= 0:
                break
            take = min(left, part.rows)
            whole.parts.append(
                _Part(
                    part.batch,
                    take,
                    {name: rows[:take] for name, rows in part.streams.items()},
                    None if part.targets is None else part.targets[:take],
                    None if part.images is None else part.images[:take],
                )
            )
            left -= take
        return whole


def thumbnails(images: torch.Tensor) -> torch.Tensor:
    """Images [N, C, H, W] as the projector shows them: each stretched min-max to [0, 1], at
    most THUMBNAIL pixels a side, 1 or 3 channels."""
    images = images.detach().float()
    if images.shape[1] not in (1, 3):
        images = images[:, :1]
    flat = images.flatten(1)
    low, high = flat.amin(dim=1), flat.amax(dim=1)
    scale = torch.where(high > low, high - low, torch.ones_like(high))
    images = (images - low.view(-1, 1, 1, 1)) / scale.view(-1, 1, 1, 1)
    largest = max(images.shape[2], images.shape[3])
    if largest > THUMBNAIL:
        size = [max(1, round(s * THUMBNAIL / largest)) for s in images.shape[2:]]
        images = F.interpolate(images, size=size, mode="bilinear", antialias=True)
    return images.clamp(0, 1).cpu()


class EmbeddingExport(Hook):
    """Streams of the last full pass of a section, written to the projector when the run ends."""

    name = "embeddings"
    every_rank = True  # each process keeps the first rows of its share; rank 0 takes them all

    def __init__(self, config: AnalysisConfig) -> None:
        self.config = config
        settings = config.settings("embeddings")
        assert isinstance(settings, EmbeddingsConfig)
        self.settings = settings
        self.enabled = config.enabled("embeddings")
        self.active = self.enabled and bool(settings.streams)
        self.current = _Pass()
        self.final: _Pass | None = None
        self._warned: set[str] = set()
        self.distributed: Distributed = SINGLE  # the run's, from before_train

    def before_train(self, run: RunView) -> None:
        self.distributed = run.distributed
        self._check(run)
        # Rank 0 alone has the TensorBoard writer: the others follow its decision.
        self.active = self.distributed.broadcast(self.active)

    def _check(self, run: RunView) -> None:
        if self.enabled and not self.settings.streams:
            why = "no streams to export: name them in analysis.embeddings.streams"
            say_skipped(run, ["embeddings"], why)
        if not self.active:
            return
        section = self.settings.section
        if run.tensorboard is None:
            why = "TensorBoard is off (--tensorboard 0): the projector is part of it"
            say_skipped(run, ["embeddings"], why)
            self.active = False
        elif getattr(run, f"{section}_data") is None:
            why = f"the run has no {section} section (analysis.embeddings.section: {section})"
            say_skipped(run, ["embeddings"], why)
            self.active = False

    def eval_batch(self, run: RunView, section: str, batch: Batch) -> None:
        if not self.active or section != self.settings.section:
            return
        kept = self.current
        number, kept.batches = kept.batches, kept.batches + 1
        take = self.settings.max_samples - kept.rows
        if take <= 0:
            return
        output = self.config.outputs[0]
        streams: dict[str, torch.Tensor] = {}
        for stream in self.settings.streams:
            value = batch.get(stream)
            if not isinstance(value, torch.Tensor) or value.ndim < 2:
                self._warn(run, stream, "is not a tensor [batch, dims] in the batch")
                continue
            streams[stream] = value[:take].detach().flatten(1).float().cpu()
        taken = min((rows.shape[0] for rows in streams.values()), default=0)
        if not taken:
            return
        streams = {name: rows[:taken] for name, rows in streams.items()}
        targets = batch.get(output.targets)
        if not isinstance(targets, torch.Tensor) or targets.ndim != 1:
            targets = None
        images = batch.get(output.images) if output.images is not None else None
        if not isinstance(images, torch.Tensor) or images.ndim != 4:
            images = None
        kept.parts.append(
            _Part(
                number,
                taken,
                streams,
                None if targets is None else targets[:taken].cpu(),
                None if images is None else thumbnails(images[:taken]),
            )
        )

    def after_eval(self, run: RunView, section: str, values: dict[str, Any], partial: bool) -> None:
        if not self.active or section != self.settings.section:
            return
        kept, self.current = self.current, _Pass()
        if partial:
            return
        if self.distributed.active:  # every process takes part, whatever rows it kept
            kept = _Pass.merged(self.distributed.gather(kept), self.settings.max_samples)
            if not self.distributed.main:
                return
        if kept.rows:
            self.final = kept

    def after_train(self, run: RunView, summary: dict[str, Any]) -> None:
        if not self.active or self.final is None:
            return
        kept, writer = self.final, run.tensorboard
        output = self.config.outputs[0]
        metadata = None
        parts = kept.parts
        targets = _joined([part.targets for part in parts])
        if targets is not None:
            names = class_names(run.pipeline, output)
            metadata = [
                names[t] if names is not None and 0 <= t < len(names) else str(t)
                for t in targets.tolist()
            ]
        images = _joined([part.images for part in parts])
        streams = list(dict.fromkeys(name for part in parts for name in part.streams))
        for stream in streams:
            matrix = kept.joined(stream)
            if matrix is None:  # a stream missing from some batches
                self._warn(run, stream, "was missing from some batches")
                continue
            writer.add_embedding(
                matrix,
                metadata=metadata,
                label_img=images,
                global_step=run.progress.episode,
                tag=stream,
            )
        writer.flush()
        run.log.info(
            "embeddings: %d points of %s (%s) sent to the TensorBoard projector",
            kept.rows,
            ", ".join(streams),
            self.settings.section,
        )

    def _warn(self, run: RunView, stream: str, problem: str) -> None:
        if stream not in self._warned:
            self._warned.add(stream)
            say_skipped(run, [f"embeddings (stream '{stream}')"], f"the stream {problem}")
