"""The `analysis:` section: what a training run leaves behind to understand and debug a model.

    analysis:
      preset: default            # minimal (search runs) | default | full
      roc: false                 # any item switched on or off over the preset
      worst_samples: {count: 32}

Each item is `null` (follow the preset), `true`/`false`, or for items with settings a mapping
(which switches it on). Outputs to analyse default to the `predictions` / `targets` /
`indices` streams, which is what classification pipelines publish. Imports no torch.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from torchloom.core.file_names import PlainFileName


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OutputSpec(_Strict):
    """A classification output: which streams hold its scores, targets and sample ids."""

    name: PlainFileName = Field("predictions", description="used in report file names")
    predictions: str = Field("predictions", description="stream of class scores [batch, classes]")
    targets: str = Field("targets", description="stream of class indices [batch]")
    ids: str = Field(
        "indices",
        description="stream of stable sample ids [batch] (the index of the sample in its task)",
    )
    images: str | None = Field(
        None, description="stream of images [batch, C, H, W], to export samples as pictures"
    )
    texts: str | None = Field(
        None, description="stream of texts (list of strings), to export samples as a table"
    )
    class_names: str | None = Field(
        "label_word_mappings",
        description="global mapping class names to indices; null: classes are numbered",
    )


class Switch(_Strict):
    enabled: bool | None = Field(None, description="null: as the preset says")


class WorstSamplesConfig(Switch):
    count: int = Field(16, gt=0, description="hardest samples to export")
    section: Literal["training", "validation"] = Field(
        "training", description="whose per-sample losses are tracked across epochs"
    )


class SampleExportConfig(Switch):
    count: int = Field(16, gt=0, description="samples in the grid")
    section: Literal["training", "validation", "test"] = "training"


class AugmentationConfig(Switch):
    count: int = Field(8, gt=0, description="draws of the task's random transforms")
    sample: int = Field(0, ge=0, description="index of the sample to augment")


class EmbeddingsConfig(Switch):
    streams: list[str] = Field(
        default_factory=list,
        description="streams [batch, dims] to send to the TensorBoard projector (empty: none)",
    )
    section: Literal["validation", "test"] = "validation"
    max_samples: int = Field(1000, gt=0, description="at most this many points")


class LayerStatisticsConfig(Switch):
    interval: int | None = Field(
        None, gt=0, description="episodes between measurements (default: the logging interval)"
    )
    vanishing: float = Field(1e-7, gt=0, description="warn when a layer's gradient norm is below")
    exploding: float = Field(1e3, gt=0, description="warn when a layer's gradient norm is above")


ITEMS = (
    "confusion_matrix",
    "classification_report",
    "roc",
    "history",
    "prediction_errors",
    "worst_samples",
    "random_samples",
    "augmentation",
    "embeddings",
    "layer_statistics",
    "learning_rate",
    "model_summary",
)

# What each preset switches on. `minimal` is for search runs: cheap, no files per sample.
PRESETS: dict[str, frozenset[str]] = {
    "minimal": frozenset({"history", "learning_rate"}),
    "default": frozenset(
        {
            "confusion_matrix",
            "classification_report",
            "roc",
            "history",
            "prediction_errors",
            "worst_samples",
            "random_samples",
            "learning_rate",
            "model_summary",
        }
    ),
    "full": frozenset(ITEMS),
}


class AnalysisConfig(_Strict):
    preset: Literal["minimal", "default", "full"] = "default"
    outputs: list[OutputSpec] = Field(default_factory=lambda: [OutputSpec()])
    confusion_matrix: bool | None = None
    classification_report: bool | None = None
    roc: bool | None = None
    history: bool | None = None
    prediction_errors: bool | None = None
    worst_samples: WorstSamplesConfig | bool | None = None
    random_samples: SampleExportConfig | bool | None = None
    augmentation: AugmentationConfig | bool | None = None
    embeddings: EmbeddingsConfig | bool | None = None
    layer_statistics: LayerStatisticsConfig | bool | None = None
    learning_rate: bool | None = None
    model_summary: bool | None = None

    def enabled(self, item: str) -> bool:
        """Whether an item runs: its own switch, else the preset's."""
        value = getattr(self, item)
        if isinstance(value, Switch):
            value = True if value.enabled is None else value.enabled
        return value if isinstance(value, bool) else item in PRESETS[self.preset]

    def settings(self, item: str) -> Switch:
        """An item's settings (defaults when it was given as true/false/null)."""
        value = getattr(self, item)
        if isinstance(value, Switch):
            return value
        # The settings model is the Switch subclass in the field's annotation (X | bool | None).
        annotation = type(self).model_fields[item].annotation
        models = [a for a in get_args(annotation) if isinstance(a, type) and issubclass(a, Switch)]
        assert models, f"{item} has no settings"
        return models[0]()
