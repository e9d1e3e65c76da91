"""Which streams the per-sample analysis reads: the classification outputs of a pipeline.

A classification output is found by what the pipeline does with it, never by its name: the
stream a loss or a statistic reads as class scores [batch, classes] (floating point), together
with the stream it reads as class targets [batch] (integers). Renaming a model's
`predictions` (`streams: {predictions: logits}`) and its readers follows along; a pipeline
with two heads has two outputs. Sample ids are the task's `indices` stream, whatever the
config renamed it to.

An `analysis.outputs` entry may name any of its streams; those it leaves out are found as
above. What it names must exist (a ConfigError, which `loom check` reports too), and with
several classification outputs an entry names its predictions. A pipeline in which nothing
reads class scores and targets (a regression) skips the per-sample items and says so
(`skipped.py`), unless an entry names its predictions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from torchloom.analysis.schema import ITEMS, OutputSpec
from torchloom.core.component import Component, Loss, Statistic
from torchloom.core.pipeline import Pipeline
from torchloom.core.streams import StreamSpec
from torchloom.errors import Problem, did_you_mean

IDS_KEY = "indices"  # a task's stream of sample positions (every classification task has it)
TARGETS_KEY = "targets"  # the preferred targets input when a reader has several [batch] ints
STREAM_FIELDS = ("predictions", "targets", "ids", "images", "texts")
NO_CLASSIFICATION = (
    "no classification output: no loss or statistic reads class scores [batch, classes] "
    "and class targets [batch]; name the streams under analysis.outputs, e.g. "
    "outputs: [{predictions: STREAM, targets: STREAM}]"
)


@dataclass(frozen=True)
class ClassificationStreams:
    """A stream of class scores and the targets a component reads it against."""

    predictions: str
    targets: str
    reader: str  # the component's label, for messages


@dataclass
class ResolvedOutputs:
    """The outputs with every stream named; the items that cannot run and why; problems with
    what the config itself named (errors)."""

    outputs: list[OutputSpec]
    skipped: dict[str, list[str]] = field(default_factory=dict)  # why -> items
    problems: list[Problem] = field(default_factory=list)


def _is_scores(spec: StreamSpec) -> bool:
    return (
        spec.dims is not None
        and len(spec.dims) == 2
        and spec.dtypes is not None
        and all(isinstance(t, torch.dtype) and t.is_floating_point for t in spec.dtypes)
    )


def _is_class_indices(spec: StreamSpec) -> bool:
    return (
        spec.dims is not None
        and len(spec.dims) == 1
        and spec.dtypes is not None
        and all(
            isinstance(t, torch.dtype) and not t.is_floating_point and t is not torch.bool
            for t in spec.dtypes
        )
    )


def _read_as_classification(component: Component) -> ClassificationStreams | None:
    specs = component.input_specs()
    scores = [key for key, spec in specs.items() if _is_scores(spec)]
    targets = [key for key, spec in specs.items() if _is_class_indices(spec)]
    if len(targets) > 1 and TARGETS_KEY in targets:  # e.g. targets and groups
        targets = [TARGETS_KEY]
    if len(scores) != 1 or len(targets) != 1:
        return None
    return ClassificationStreams(
        component.stream_name(scores[0]), component.stream_name(targets[0]), component.label
    )


def classification_streams(pipeline: Pipeline) -> list[ClassificationStreams]:
    """Every stream of class scores that a loss or statistic reads, once, in pipeline order."""
    found: dict[str, ClassificationStreams] = {}
    for component in pipeline.components.values():
        if isinstance(component, Loss | Statistic):
            streams = _read_as_classification(component)
            if streams is not None:
                found.setdefault(streams.predictions, streams)
    return list(found.values())


def ids_stream(pipeline: Pipeline) -> str | None:
    """The pipeline-wide name of the tasks' sample-id stream (the training task's first)."""
    for task in pipeline.tasks.values():
        if IDS_KEY in task.output_specs():
            return task.stream_name(IDS_KEY)
    return None


def available_streams(pipeline: Pipeline) -> set[str]:
    names: set[str] = set()
    for task in pipeline.tasks.values():
        names |= {task.stream_name(k) for k in task.output_specs()}
    for component in pipeline.components.values():
        names |= {component.stream_name(k) for k in component.output_specs()}
    return names


def resolve_outputs(
    outputs: list[OutputSpec],
    explicit: bool,
    pipeline: Pipeline,
    where: Callable[..., str],
    wanted: set[str],
) -> ResolvedOutputs:
    """Every output's streams named. `explicit`: the config has `outputs:`; `wanted`: the
    per-sample items that are on (what a pipeline without a classification output skips)."""
    found = classification_streams(pipeline)
    ids = ids_stream(pipeline)
    result = ResolvedOutputs([])
    if not explicit:
        outputs = [OutputSpec(predictions=f.predictions, targets=f.targets) for f in found]
    if not found and not any("predictions" in o.model_fields_set for o in outputs):
        # Nothing to analyse per sample (a regression, say); an `outputs:` entry may still
        # say which images or texts the sample grids show.
        if wanted:
            result.skipped[NO_CLASSIFICATION] = [i for i in ITEMS if i in wanted]
        outputs = outputs or [OutputSpec()]
        result.outputs = [o.model_copy(update={"ids": ids} if ids else {}) for o in outputs]
    else:
        for index, output in enumerate(outputs):
            given = set(output.model_fields_set)  # what the config named (or what was found)
            result.outputs.append(_resolve_one(output, given, found, ids, index, where, result))
    names = [output.name for output in result.outputs]
    for index, name in enumerate(names):
        if name in names[:index]:
            result.problems.append(
                Problem(
                    where("analysis", "outputs", index, "name"),
                    f"analysis output '{name}'",
                    "two outputs have this name (it names their report files)",
                    "give each output its own `name`",
                )
            )
    available = available_streams(pipeline)
    for index, output in enumerate(result.outputs):
        for stream_field in STREAM_FIELDS:
            stream = getattr(output, stream_field)
            named = explicit and stream_field in outputs[index].model_fields_set
            if stream is None or stream in available or not named:
                continue
            result.problems.append(
                Problem(
                    where("analysis", "outputs", index, stream_field),
                    f"analysis output '{output.name}'",
                    f"{stream_field} stream '{stream}' is produced by no component or task",
                    did_you_mean(stream, available),
                )
            )
    # Worst samples tracks losses by sample id. Without any, it cannot run; an output that
    # names its own ids while others have none is told apart when the batches come.
    worst = "worst_samples" in wanted and NO_CLASSIFICATION not in result.skipped
    if worst and all(o.ids not in available for o in result.outputs):
        result.skipped.setdefault(
            "the task publishes no sample ids (an `indices` stream), which worst samples "
            "tracks losses by; name a stream of stable ids [batch] under analysis.outputs "
            "(ids: STREAM)",
            [],
        ).append("worst_samples")
    return result


def _resolve_one(
    output: OutputSpec,
    given: set[str],
    found: list[ClassificationStreams],
    ids: str | None,
    index: int,
    where: Callable[..., str],
    result: ResolvedOutputs,
) -> OutputSpec:
    """One output with its unnamed streams found; a problem when its scores are ambiguous."""
    update: dict[str, str] = {}
    if "predictions" in given:
        reader = next((f for f in found if f.predictions == output.predictions), None)
        if "targets" not in given and reader is not None:
            update["targets"] = reader.targets
    else:
        chosen = _only_or_default(found)
        if chosen is None:
            listed = ", ".join(f"'{f.predictions}'" for f in found) or "none"
            result.problems.append(
                Problem(
                    where("analysis", "outputs", index),
                    f"analysis output {index + 1}",
                    f"names no predictions stream, and the pipeline's classification "
                    f"outputs are not one (found: {listed})",
                    "set `predictions:` (and `targets:`) of this output",
                )
            )
        else:
            update["predictions"] = chosen.predictions
            if "targets" not in given:
                update["targets"] = chosen.targets
    if "ids" not in given and ids is not None:
        update["ids"] = ids
    if "name" not in given:
        update["name"] = update.get("predictions", output.predictions)
    return output.model_copy(update=update)


def _only_or_default(found: list[ClassificationStreams]) -> ClassificationStreams | None:
    """The one classification output; of several, the one named `predictions` if any."""
    if len(found) == 1:
        return found[0]
    default = OutputSpec.model_fields["predictions"].default
    return next((f for f in found if f.predictions == default), None)
