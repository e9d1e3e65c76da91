"""From a config's `analysis:` section (and the built pipeline) to the hooks of a run.

Hook classes load only when their item is on, so a `minimal` run imports no plotting code.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from torchloom.analysis.outputs import available_streams, resolve_outputs
from torchloom.analysis.plotting import PlotBudget
from torchloom.analysis.schema import AnalysisConfig, EmbeddingsConfig
from torchloom.analysis.skipped import say_skipped
from torchloom.core.pipeline import Pipeline
from torchloom.engine.state import Hook
from torchloom.errors import ConfigError, Problem, Where, did_you_mean, validation_problems

if TYPE_CHECKING:
    from torchloom.engine.state import RunView

# hook class -> (module, the items that switch it on)
HOOKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ModelSummary": ("torchloom.analysis.model_summary", ("model_summary",)),
    "ClassificationAnalysis": (
        "torchloom.analysis.classification",
        ("confusion_matrix", "classification_report", "roc", "prediction_errors"),
    ),
    "HistoryPlots": ("torchloom.analysis.history", ("history",)),
    "LearningRateRecorder": ("torchloom.analysis.learning_rate", ("learning_rate",)),
    "WorstSamples": ("torchloom.analysis.worst_samples", ("worst_samples",)),
    "SampleExport": ("torchloom.analysis.sample_export", ("random_samples", "augmentation")),
    "EmbeddingExport": ("torchloom.analysis.embeddings", ("embeddings",)),
    "LayerStatistics": ("torchloom.analysis.layer_statistics", ("layer_statistics",)),
    "ArchitecturePlots": ("torchloom.analysis.architecture", ("architecture",)),
}
# Items that read the classification outputs' streams.
NEEDS_OUTPUTS = (
    "confusion_matrix",
    "classification_report",
    "roc",
    "prediction_errors",
    "worst_samples",
)


def _section(data: Mapping[str, Any]) -> Any:
    """The `analysis:` section as a mapping: a preset name alone (`analysis: full`) stands
    for `{preset: full}`; no section for the default preset."""
    raw = data.get("analysis")
    return {"preset": raw} if isinstance(raw, str) else (raw or {})


def parse_analysis(data: Mapping[str, Any], where: Where) -> AnalysisConfig:
    try:
        return AnalysisConfig.model_validate(_section(data))
    except ValidationError as error:
        problems = validation_problems(error, where, ("analysis",), AnalysisConfig)
        raise ConfigError(problems) from error


def check_analysis(
    data: Mapping[str, Any], pipeline: Pipeline, where: Where
) -> tuple[AnalysisConfig, dict[str, list[str]]]:
    """The section with every output's streams named (see outputs.py), and {why: items} of
    the items that cannot run in this pipeline. What the config names must exist: a
    ConfigError otherwise, raised here, so `loom check` reports it before any data is read."""
    config = parse_analysis(data, where)
    section = _section(data)
    explicit = isinstance(section, Mapping) and "outputs" in section
    wanted = {item for item in NEEDS_OUTPUTS if config.enabled(item)}
    resolved = resolve_outputs(config.outputs, explicit, pipeline, where, wanted)
    embeddings = config.embeddings
    named = [] if not isinstance(embeddings, EmbeddingsConfig) else embeddings.streams
    available = available_streams(pipeline)
    unknown = [
        Problem(
            where("analysis", "embeddings", "streams"),
            f"embedding stream '{stream}'",
            "is produced by no component or task",
            did_you_mean(stream, available),
        )
        for stream in named
        if stream not in available
    ]
    if resolved.problems or unknown:
        raise ConfigError(resolved.problems + unknown)
    return config.model_copy(update={"outputs": resolved.outputs}), resolved.skipped


def build_hooks(data: Mapping[str, Any], pipeline: Pipeline, where: Where) -> list[Hook]:
    """The analysis hooks a run's config asks for (the `default` preset when it says none),
    and one that says which items cannot run (once the run has a log)."""
    config, skipped = check_analysis(data, pipeline, where)
    # Items that cannot run are switched off (SkippedItems says so); an item that cannot
    # run for some outputs only finds out per output, in its hook.
    dropped = {item for items in skipped.values() for item in items}
    config = config.model_copy(update=dict.fromkeys(dropped, False))
    hooks: list[Hook] = []
    budget = PlotBudget()  # one per run, shared by the hooks that plot
    for class_name, (module, items) in HOOKS.items():
        wanted = [i for i in items if config.enabled(i)]
        if wanted:
            cls = getattr(importlib.import_module(module), class_name)
            applies = getattr(cls, "applies", None)  # a hook for some pipelines only
            if applies is not None and not applies(pipeline):
                continue
            takes_budget = "budget" in inspect.signature(cls).parameters
            hooks.append(cls(config, budget) if takes_budget else cls(config))
    if skipped:
        hooks.append(SkippedItems(skipped))
    return hooks


class SkippedItems(Hook):
    """Says, when the run starts, which items the analysis section could not build hooks for
    (decided from the config and the pipeline, before the run had a log or a folder)."""

    name = "skipped_items"

    def __init__(self, skipped: Mapping[str, Sequence[str]]) -> None:
        self.skipped = dict(skipped)  # why -> items

    def before_train(self, run: RunView) -> None:
        for why, items in self.skipped.items():
            say_skipped(run, items, why)

    def state_dict(self) -> dict[str, Any]:
        return {}
