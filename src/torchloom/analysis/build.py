"""From a config's `analysis:` section (and the built pipeline) to the hooks of a run.

Hook classes load only when their item is on, so a `minimal` run imports no plotting code.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from torchloom.analysis.plotting import PlotBudget
from torchloom.analysis.schema import AnalysisConfig, EmbeddingsConfig
from torchloom.core.pipeline import Pipeline
from torchloom.engine.state import Hook
from torchloom.errors import ConfigError, Problem, Where, did_you_mean

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
        problems = []
        for item in error.errors():
            loc = tuple(str(p) for p in item["loc"])
            key = ".".join(("analysis", *loc))
            if item["type"] == "extra_forbidden":
                hint = did_you_mean(loc[-1], AnalysisConfig.model_fields) if len(loc) == 1 else ""
                problems.append(
                    Problem(where("analysis", *loc), f"key '{key}'", "unknown key", hint)
                )
            else:
                problems.append(Problem(where("analysis", *loc), f"key '{key}'", item["msg"]))
        raise ConfigError(problems) from error


def _streams(pipeline: Pipeline) -> set[str]:
    names: set[str] = set()
    for task in pipeline.tasks.values():
        names |= {task.stream_name(k) for k in task.output_specs()}
    for component in pipeline.components.values():
        names |= {component.stream_name(k) for k in component.output_specs()}
    return names


def check_outputs(config: AnalysisConfig, pipeline: Pipeline, where: Where, explicit: bool) -> bool:
    """Whether the outputs' streams exist. Outputs the user named must exist (ConfigError);
    the default output is simply skipped by pipelines that do not publish it."""
    available = _streams(pipeline)
    problems = []
    for index, output in enumerate(config.outputs):
        for field in ("predictions", "targets", "ids", "images", "texts"):
            stream = getattr(output, field)
            if stream is not None and stream not in available:
                problems.append(
                    Problem(
                        where("analysis", "outputs", index, field),
                        f"analysis output '{output.name}'",
                        f"{field} stream '{stream}' is produced by no component or task",
                        did_you_mean(stream, available),
                    )
                )
    embeddings = config.embeddings
    named = [] if not isinstance(embeddings, EmbeddingsConfig) else embeddings.streams
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
    if unknown or (problems and explicit):
        raise ConfigError(unknown + (problems if explicit else []))
    return not problems


def checked_analysis(
    data: Mapping[str, Any], pipeline: Pipeline, where: Where
) -> tuple[AnalysisConfig, bool]:
    """The `analysis:` section checked against the pipeline (what `loom check` and
    `loom train` both reject), and whether the outputs' streams exist."""
    config = parse_analysis(data, where)
    section = _section(data)
    explicit = isinstance(section, Mapping) and "outputs" in section
    return config, check_outputs(config, pipeline, where, explicit)


def build_hooks(data: Mapping[str, Any], pipeline: Pipeline, where: Where) -> list[Hook]:
    """The analysis hooks a run's config asks for (the `default` preset when it says none)."""
    config, outputs_ok = checked_analysis(data, pipeline, where)
    hooks: list[Hook] = []
    budget = PlotBudget()  # one per run, shared by the hooks that plot
    for class_name, (module, items) in HOOKS.items():
        wanted = [i for i in items if config.enabled(i)]
        if not outputs_ok:
            wanted = [i for i in wanted if i not in NEEDS_OUTPUTS]
        if wanted:
            cls = getattr(importlib.import_module(module), class_name)
            takes_budget = "budget" in inspect.signature(cls).parameters
            hooks.append(cls(config, budget) if takes_budget else cls(config))
    return hooks
