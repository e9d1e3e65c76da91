"""Viewers: components that show what flows through a pipeline while it runs.

They read streams and publish none, so adding one never changes a run's results. Each keeps
a batch counter per mode (training batches and evaluation batches are counted apart), and
acts on batch 1, 1 + interval, 1 + 2 * interval, ... of each: the cost is bounded by the
interval, whatever the data.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from pydantic import Field

from torchloom.core.component import Batch, BuildContext, Component, ComponentParams
from torchloom.core.streams import StreamSpec

LOGGER = logging.getLogger("torchloom.viewer")
MAX_VALUES = 6  # first values shown of a tensor
MAX_TEXT = 1000  # characters of a string shown


def _batch_size(inputs: Batch) -> int | None:
    for value in inputs.values():
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            return int(value.shape[0])
        if isinstance(value, list | tuple):
            return len(value)
    return None


def _one_sample(value: Any, index: int, batch_size: int | None) -> Any:
    """The sample `index` of a batched stream; unbatched streams (a loss) as they are."""
    if isinstance(value, torch.Tensor) and value.ndim > 0 and value.shape[0] == batch_size:
        return value[min(index, batch_size - 1)]
    if isinstance(value, list | tuple) and len(value) == batch_size and batch_size:
        return value[min(index, batch_size - 1)]
    return value


def preview_value(value: Any) -> str:
    """A short representation: tensor shape, dtype and first values; strings as they are."""
    if isinstance(value, torch.Tensor):
        flat = value.detach().flatten()
        if value.ndim == 0:
            return str(flat[0].item())
        head = flat[:MAX_VALUES].cpu().tolist()
        shown = ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in head)
        more = ", ..." if flat.numel() > MAX_VALUES else ""
        return (
            f"tensor{list(value.shape)} {str(value.dtype).removeprefix('torch.')} [{shown}{more}]"
        )
    if isinstance(value, str):
        return value if len(value) <= MAX_TEXT else value[:MAX_TEXT] + f"... ({len(value)} chars)"
    text = repr(value)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "..."


class _Counter:
    """Batches seen per mode; `due()` is true on the first batch and every `interval` after."""

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self.seen = {True: 0, False: 0}

    def due(self, training: bool) -> tuple[bool, int]:
        self.seen[training] += 1
        number = self.seen[training]
        return (number - 1) % self.interval == 0, number


class StreamViewerParams(ComponentParams):
    input_streams: list[str] = Field(
        min_length=1, description="streams to show (pipeline-wide names)"
    )
    interval: int = Field(100, gt=0, description="batches (episodes) between two views")
    sample: int = Field(
        0, ge=0, description="index of the sample in the batch (the last one if it is smaller)"
    )


class StreamViewer(Component):
    """Logs chosen streams of one sample of a batch every `interval` batches, through the
    python logger `torchloom.viewer` (INFO): tensors as shape, dtype and first values,
    strings as they are. Training and evaluation batches are counted apart.

    ```yaml
    pipeline:
      viewer:
        type: StreamViewer
        input_streams: [labels, targets, predictions]
        interval: 50
        sample: 0
    ```
    """

    Params = StreamViewerParams
    params: StreamViewerParams

    def __init__(self, params: StreamViewerParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self._counter = _Counter(params.interval)

    def input_specs(self) -> dict[str, StreamSpec]:
        return {
            name: StreamSpec(None, None, "a stream to show") for name in self.params.input_streams
        }

    def forward(self, inputs: Batch) -> Batch:
        due, number = self._counter.due(self.training)
        if not due or not LOGGER.isEnabledFor(logging.INFO):
            return {}
        size = _batch_size(inputs)
        shown = "; ".join(
            f"{name}: {preview_value(_one_sample(inputs[name], self.params.sample, size))}"
            for name in self.params.input_streams
        )
        mode = "training" if self.training else "evaluation"
        LOGGER.info(
            "%s: %s batch %d, sample %d: %s", self.name, mode, number, self.params.sample, shown
        )
        return {}


class ImageViewerParams(ComponentParams):
    images: str = Field("inputs", description="stream of images [batch, channels, height, width]")
    labels: str | None = Field(
        None, description="stream of true labels (class indices or names); null: none shown"
    )
    predictions: str | None = Field(
        None,
        description="stream of predictions: class scores [batch, classes] (the highest is "
        "shown), class indices or names; null: none shown",
    )
    interval: int = Field(100, gt=0, description="batches (episodes) between two grids")
    count: int = Field(16, gt=0, le=64, description="images per grid (at most 64)")
    limit: int = Field(100, gt=0, description="grids written per pass at most (bounds disk use)")


class ImageViewer(Component):
    """Every `interval` batches, saves a PNG grid of the first `count` images of the batch
    with their labels and predictions (red where they differ) into `viewers/` of the folder
    the worker gives the pass: the run folder in `loom train`, the pass folder in
    `loom process`. Without a folder it does nothing. Files are named
    `<name>-<phase>-<batch>.png`, phase `training`, `validation` (evaluation batches during
    training) or the processed section.

    ```yaml
    pipeline:
      image_viewer:
        type: ImageViewer
        images: inputs
        labels: targets
        predictions: predictions
        interval: 200
        count: 16
    ```
    """

    Params = ImageViewerParams
    params: ImageViewerParams

    def __init__(self, params: ImageViewerParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self._counter = _Counter(params.interval)
        self._folder: Path | None = None
        self._section = ""
        self.written: list[Path] = []  # files of the current pass, newest last

    def input_specs(self) -> dict[str, StreamSpec]:
        # Keyed by the pipeline-wide names the params give, as StreamFileExporter's are.
        p = self.params
        specs = {p.images: StreamSpec(("batch", -1, -1, -1), None, "images to show")}
        if p.labels is not None:
            specs[p.labels] = StreamSpec(None, None, "true labels of the images")
        if p.predictions is not None:
            specs[p.predictions] = StreamSpec(None, None, "predictions for the images")
        return specs

    def begin_pass(self, section: str, folder: Path) -> None:
        self._folder, self._section = folder, section
        self._counter = _Counter(self.params.interval)
        self.written = []

    def end_pass(self) -> None:
        self._folder = None

    def forward(self, inputs: Batch) -> Batch:
        if self._folder is None:
            return {}
        due, number = self._counter.due(self.training)
        if not due or len(self.written) >= self.params.limit:
            return {}
        phase = "validation" if self._section == "training" and not self.training else self._section
        path = self._folder / "viewers" / f"{self.name}-{phase}-{number:06d}.png"
        p = self.params
        images = inputs[p.images][: p.count].detach().float().cpu()
        labels = inputs[p.labels] if p.labels is not None else None
        predictions = inputs[p.predictions] if p.predictions is not None else None
        captions = _captions(labels, predictions, len(images))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            save_grid(images, captions, path, f"{self.name}: {phase} batch {number}")
        except OSError as error:  # a full disk must not end a training run: stop viewing
            LOGGER.warning(
                "%s: cannot write %s (%s); no more grids in this pass", self.name, path, error
            )
            self._folder = None
            return {}
        self.written.append(path)
        return {}


def _labels_of(value: Any, count: int) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.ndim == 2:  # class scores: the predicted class
            value = value.argmax(dim=1)
        return [str(v) for v in value[:count].cpu().tolist()]
    return [str(v) for v in list(value)[:count]]


def _captions(labels: Any, predictions: Any, count: int) -> list[tuple[str, bool]]:
    """(caption, wrong) per image: 'label 3 / pred 5'. Wrong when they differ, judged only
    when both are of one kind (class indices, or names): a name is never compared with an
    index."""
    truth = _labels_of(labels, count) or []
    guess = _labels_of(predictions, count) or []
    comparable = isinstance(labels, torch.Tensor) == isinstance(predictions, torch.Tensor)
    captions = []
    for i in range(count):
        known_truth = truth[i] if i < len(truth) else None
        known_guess = guess[i] if i < len(guess) else None
        parts = [f"label {known_truth}"] if known_truth is not None else []
        parts += [f"pred {known_guess}"] if known_guess is not None else []
        both = known_truth is not None and known_guess is not None
        captions.append((" / ".join(parts), comparable and both and known_truth != known_guess))
    return captions


def save_grid(
    images: torch.Tensor, captions: list[tuple[str, bool]], path: Path, title: str
) -> None:
    """A grid of images (each scaled to its own range) with captions, drawn with Agg as one
    mosaic on one axes: a tenth of the cost of a subplot per image."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if images.ndim == 3:  # [batch, height, width]: grey images
        images = images.unsqueeze(1)
    images = images[:, :3] if images.shape[1] >= 3 else images[:, :1].expand(-1, 3, -1, -1)
    count, _, height, width = images.shape
    low = images.amin(dim=(1, 2, 3), keepdim=True)
    span = (images.amax(dim=(1, 2, 3), keepdim=True) - low).clamp_min(1e-12)
    images = (images - low) / span
    columns = min(8, count)
    rows = (count + columns - 1) // columns
    pad_x, pad_y = max(2, width // 8), max(4, height // 3)  # room for a caption above each
    mosaic = torch.ones(3, rows * (height + pad_y), columns * (width + pad_x))
    for index in range(count):
        top = (index // columns) * (height + pad_y) + pad_y
        left = (index % columns) * (width + pad_x)
        mosaic[:, top : top + height, left : left + width] = images[index]
    figure = Figure(figsize=(1.5 * columns, 1.7 * rows + 0.3), dpi=80)
    FigureCanvasAgg(figure)
    axes = figure.add_axes((0.0, 0.0, 1.0, 0.94))
    axes.imshow(mosaic.permute(1, 2, 0).numpy(), interpolation="nearest")
    axes.axis("off")
    figure.suptitle(title, fontsize=9)
    for index, (caption, wrong) in enumerate(captions[:count]):
        x = (index % columns) * (width + pad_x) + width / 2
        y = (index // columns) * (height + pad_y) + pad_y - 1
        color = "red" if wrong else "black"
        axes.text(x, y, caption, fontsize=7, color=color, ha="center", va="bottom")
    figure.savefig(path, format="png")
