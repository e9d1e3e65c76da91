"""The `analysis:` section: what a training run leaves behind to understand and debug a model.

    analysis:
      preset: default            # minimal (search runs) | default | full
      roc: false                 # any item switched on or off over the preset
      worst_samples: {count: 32}

Each item is `null` (follow the preset), `true`/`false`, or for items with settings a mapping
(which switches it on). The outputs to analyse are found in the pipeline (the streams a loss
or statistic reads as class scores and targets, see outputs.py) unless `outputs:` names them.
The field descriptions are the documentation: the settings tables of docs/analysis.md are
generated from them (tools/gen_reference.py). Imports no torch.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import ConfigDict, Field

from torchloom.config_model import ConfigModel
from torchloom.core.file_names import PlainFileName


class _Strict(ConfigModel):
    model_config = ConfigDict(extra="forbid")


class OutputSpec(_Strict):
    """A classification output: which streams hold its scores, targets and sample ids. A
    stream left out is found in the pipeline; the defaults shown are for pipelines that have
    nothing to find them from."""

    name: PlainFileName = Field(
        "predictions", description="starts its report file names; left out: its predictions stream"
    )
    predictions: str = Field(
        "predictions",
        description="stream of class scores [batch, classes]; left out: the stream that a loss "
        "or statistic reads as class scores (when the pipeline has one such stream, or one "
        "named `predictions`)",
    )
    targets: str = Field(
        "targets",
        description="stream of class indices [batch]; left out: the one read with the predictions",
    )
    ids: str = Field(
        "indices",
        description="stream of stable sample ids [batch]; left out: the task's `indices` (the "
        "position of the sample in its split)",
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
    enabled: bool | None = Field(
        None, description="false switches the item off; null (or a mapping without it): on"
    )


class WorstSamplesConfig(Switch):
    count: int = Field(16, gt=0, description="hardest samples to export")
    section: Literal["training", "validation"] = Field(
        "training", description="whose per-sample losses are tracked across epochs"
    )


class SampleExportConfig(Switch):
    count: int = Field(16, gt=0, description="samples in the grid")
    section: Literal["training", "validation", "test"] = Field(
        "training", description="whose task the samples are drawn from"
    )


class AugmentationConfig(Switch):
    count: int = Field(8, gt=0, description="draws of the task's random transforms")
    sample: int = Field(0, ge=0, description="index of the sample to augment")


class EmbeddingsConfig(Switch):
    streams: list[str] = Field(
        default_factory=list,
        description="streams [batch, dims] to send to the TensorBoard projector (empty: none)",
    )
    section: Literal["validation", "test"] = Field(
        "validation", description="whose pass the points come from (its last full pass)"
    )
    max_samples: int = Field(1000, gt=0, description="at most this many points")


class LayerStatisticsConfig(Switch):
    interval: int | None = Field(
        None,
        gt=0,
        description="episodes between measurements, after the first step (which is always "
        "measured); null: the logging interval",
    )
    vanishing: float = Field(1e-7, gt=0, description="warn when a layer's gradient norm is below")
    exploding: float = Field(
        1e3,
        gt=0,
        description="warn when a layer's gradient norm is above (not the non-finite norms of an "
        "fp16 step the gradient scaler skipped: those are said at info level)",
    )


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
    "architecture",
)

# What each preset switches on. `minimal` is for search runs: cheap, no files per sample.
PRESETS: dict[str, frozenset[str]] = {
    "minimal": frozenset({"history", "learning_rate", "architecture"}),
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
            "architecture",
        }
    ),
    "full": frozenset(ITEMS),
}


class AnalysisConfig(_Strict):
    preset: Literal["minimal", "default", "full"] = Field(
        "default", description="which items are on when the section does not say (below)"
    )
    outputs: list[OutputSpec] = Field(
        default_factory=lambda: [OutputSpec()],
        description="the classification outputs to analyse; left out: every stream of class "
        "scores that a loss or statistic reads",
    )
    confusion_matrix: bool | None = Field(
        None, description="`reports/<output>-<split>-cm.png` (row-normalised) and `-cm.csv`"
    )
    classification_report: bool | None = Field(
        None,
        description="`reports/<output>-<split>-report.md`: accuracy, per-class precision, "
        "recall, F1 and support, top confusions",
    )
    roc: bool | None = Field(
        None,
        description="`reports/<output>-<split>-roc.png` and `.csv`: binary or one-vs-rest ROC "
        "curves with AUC (validation and test)",
    )
    history: bool | None = Field(
        None, description="`reports/history/<statistic>.png`: every statistic across epochs"
    )
    prediction_errors: bool | None = Field(
        None,
        description="`reports/<output>-<split>-errors.csv`: sample id, truth, prediction, "
        "confidence of every misclassified sample (validation and test)",
    )
    worst_samples: WorstSamplesConfig | bool | None = Field(
        None,
        description="`reports/worst_samples/`: the loss of every sample by id across epochs, "
        "a heat map and the hardest samples",
    )
    random_samples: SampleExportConfig | bool | None = Field(
        None, description="`reports/samples/random_<section>.png`, drawn before training"
    )
    augmentation: AugmentationConfig | bool | None = Field(
        None,
        description="`reports/samples/augmentation.png`: one sample through the training "
        "task's random transforms (a task without any gets a note instead)",
    )
    embeddings: EmbeddingsConfig | bool | None = Field(
        None, description="streams sent to the TensorBoard projector, with labels and thumbnails"
    )
    layer_statistics: LayerStatisticsConfig | bool | None = Field(
        None,
        description="activation mean/std/min/max and gradient norm per layer, on the first step "
        "and every `interval` episodes: `reports/layer_statistics.csv` and TensorBoard; "
        "warnings for vanishing or exploding gradients",
    )
    learning_rate: bool | None = Field(None, description="`reports/learning_rate.csv` and `.png`")
    model_summary: bool | None = Field(
        None,
        description="`reports/model_summary.md`: parameters per component, output shape per "
        "layer, a memory estimate",
    )
    architecture: bool | None = Field(
        None,
        description="`reports/architecture/<component>-alphas.png`: a DARTS search's "
        "architecture weights per edge and operation (heat maps); only with a searchable model",
    )

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
        model = settings_model(item)
        assert model is not None, f"{item} has no settings"
        return model()


def settings_model(item: str) -> type[Switch] | None:
    """The settings schema of an item: the Switch subclass in its field's annotation
    (X | bool | None); None for an item that is only switched on or off."""
    annotation = AnalysisConfig.model_fields[item].annotation
    models = [a for a in get_args(annotation) if isinstance(a, type) and issubclass(a, Switch)]
    return models[0] if models else None
