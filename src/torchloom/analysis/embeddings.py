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
from torchloom.engine.state import Hook

if TYPE_CHECKING:
    from torchloom.engine.state import RunView

THUMBNAIL = 32  # pixels a side, at most: a sprite of 1000 of them stays about 1000 px wide


@dataclass
class _Pass:
    """The rows kept from one evaluation pass, on the CPU."""

    rows: int = 0
    streams: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    targets: list[torch.Tensor] = field(default_factory=list)
    images: list[torch.Tensor] = field(default_factory=list)


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

    def before_train(self, run: RunView) -> None:
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
        take = self.settings.max_samples - kept.rows
        if take <= 0:
            return
        output = self.config.outputs[0]
        taken = 0
        for stream in self.settings.streams:
            value = batch.get(stream)
            if not isinstance(value, torch.Tensor) or value.ndim < 2:
                self._warn(run, stream, "is not a tensor [batch, dims] in the batch")
                continue
            rows = value[:take].detach().flatten(1).float().cpu()
            kept.streams.setdefault(stream, []).append(rows)
            taken = rows.shape[0]
        if not taken:
            return
        targets = batch.get(output.targets)
        if isinstance(targets, torch.Tensor) and targets.ndim == 1:
            kept.targets.append(targets[:taken].cpu())
        images = batch.get(output.images) if output.images is not None else None
        if isinstance(images, torch.Tensor) and images.ndim == 4:
            kept.images.append(thumbnails(images[:taken]))
        kept.rows += taken

    def after_eval(self, run: RunView, section: str, values: dict[str, Any], partial: bool) -> None:
        if not self.active or section != self.settings.section:
            return
        if not partial and self.current.rows:
            self.final = self.current
        self.current = _Pass()

    def after_train(self, run: RunView, summary: dict[str, Any]) -> None:
        if not self.active or self.final is None:
            return
        kept, writer = self.final, run.tensorboard
        output = self.config.outputs[0]
        metadata = None
        targets = torch.cat(kept.targets) if kept.targets else None
        if targets is not None and targets.shape[0] == kept.rows:
            names = class_names(run.pipeline, output.class_names)
            metadata = [
                names[t] if names is not None and 0 <= t < len(names) else str(t)
                for t in targets.tolist()
            ]
        images = torch.cat(kept.images) if kept.images else None
        if images is not None and images.shape[0] != kept.rows:
            images = None
        for stream, parts in kept.streams.items():
            matrix = torch.cat(parts)
            if matrix.shape[0] != kept.rows:  # a stream missing from some batches
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
            ", ".join(kept.streams),
            self.settings.section,
        )

    def _warn(self, run: RunView, stream: str, problem: str) -> None:
        if stream not in self._warned:
            self._warned.add(stream)
            say_skipped(run, [f"embeddings (stream '{stream}')"], f"the stream {problem}")
