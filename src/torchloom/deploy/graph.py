"""The tensor part of a pipeline as one module: from the task's tensor streams to chosen output
streams, through the components that produce them (never losses or statistics).

`InferenceGraph(pipeline, section, outputs)` takes positional tensors (`input_names`, in
order) and returns a tuple of tensors (`output_names`): the signature `torch.onnx.export`,
`torch.export` and latency measurement want. Components work on dicts of their default stream
names, as in the pipeline; the graph does the renaming, once per call.

A component that reads or writes something other than tensors (a tokenizer's lists of
strings, say) cannot be part of such a graph: asking for an output that depends on one is a
`DeployError` that names it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from torchloom.core.component import Batch, Component, Loss, Model, Statistic
from torchloom.core.pipeline import Pipeline
from torchloom.core.streams import StreamSpec
from torchloom.errors import DeployError, did_you_mean


def is_tensor_spec(spec: StreamSpec) -> bool:
    """Whether a stream holds tensors (a spec with python types holds lists, strings ...)."""
    return spec.dtypes is None or all(isinstance(t, torch.dtype) for t in spec.dtypes)


def _producers(pipeline: Pipeline) -> dict[str, Component]:
    found: dict[str, Component] = {}
    for component in pipeline.components.values():
        if isinstance(component, (Loss, Statistic)):
            continue
        for key in component.output_specs():
            found[component.stream_name(key)] = component
    return found


def default_outputs(pipeline: Pipeline) -> list[str]:
    """The outputs of the last model, in execution order (what a classifier predicts)."""
    models = [c for c in pipeline.components.values() if isinstance(c, Model)]
    if not models:
        raise DeployError.at("", "pipeline", "has no model component: there is nothing to deploy")
    last = models[-1]
    return [last.stream_name(key) for key in last.output_specs()]


class InferenceGraph(nn.Module):
    """Positional tensors in (`input_names`), a tuple of tensors out (`output_names`)."""

    def __init__(
        self,
        pipeline: Pipeline,
        section: str,
        outputs: Sequence[str] | None = None,
        inputs: Sequence[str] | None = None,
    ) -> None:
        """`inputs`: streams the graph starts from instead of the task's (the output of a
        tokenizer's bag of words, say), so that python-side components before them stay out."""
        super().__init__()
        task = pipeline.tasks[section]
        task_specs = {task.stream_name(k): s for k, s in task.output_specs().items()}
        producers = _producers(pipeline)
        specs = {
            component.stream_name(key): spec
            for component in producers.values()
            for key, spec in component.output_specs().items()
        }
        specs.update(task_specs)
        wanted = list(outputs) if outputs else default_outputs(pipeline)
        starts = list(inputs or ())
        for flag, names in (("--outputs", wanted), ("--inputs", starts)):
            for name in names:
                if name not in specs:
                    raise DeployError.at(
                        "command line",
                        f"{flag} {name}",
                        "no task or component of the pipeline (but losses and "
                        "statistics) produces this stream",
                        did_you_mean(name, specs) or f"streams: {', '.join(specs)}",
                    )
        # Walk back from the outputs to the inputs: the components needed, in order.
        needed = set(wanted)
        chosen: list[Component] = []
        for component in reversed(list(pipeline.components.values())):
            if isinstance(component, (Loss, Statistic)):
                continue
            produced = {component.stream_name(key) for key in component.output_specs()}
            if produced & (needed - set(starts)):
                chosen.append(component)
                needed |= {component.stream_name(k) for k in component.input_specs()}
        chosen.reverse()
        self.input_names = starts or [name for name in task_specs if name in needed]
        unused = [name for name in starts if name not in needed]
        if unused:
            raise DeployError.at(
                "command line", f"--inputs {unused[0]}", "no chosen output needs it"
            )
        self.output_names = wanted
        self.input_specs = {name: specs[name] for name in self.input_names}
        tensor_streams = [n for n, s in specs.items() if is_tensor_spec(s) and n in needed]
        for name in starts:
            if not is_tensor_spec(specs[name]):
                raise DeployError.at("command line", f"--inputs {name}", "is not a tensor stream")
        for component in chosen:
            _check_tensor_streams(component, tensor_streams)
        for name in wanted:
            if name in task_specs and not is_tensor_spec(task_specs[name]):
                raise DeployError.at("command line", f"--outputs {name}", "is not a tensor stream")
        # The models' weights belong to the pipeline's components: registered here too so
        # that `.to()`, `.eval()` and exporters see them (same objects, nothing copied).
        self.components = nn.ModuleList(chosen)
        self.chosen: list[Component] = chosen  # the same, typed
        self._routes = [
            (
                component,
                [(key, component.stream_name(key)) for key in component.input_specs()],
                {key: component.stream_name(key) for key in component.output_specs()},
            )
            for component in chosen
        ]

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        batch: Batch = dict(zip(self.input_names, tensors, strict=True))
        for component, inputs, outputs in self._routes:
            produced = component({key: batch[name] for key, name in inputs})
            for key, value in produced.items():
                batch[outputs[key]] = value
        return tuple(batch[name] for name in self.output_names)

    def example_inputs(self, batch: Batch) -> tuple[torch.Tensor, ...]:
        """The graph's inputs taken from a batch of the task (pipeline-wide names)."""
        return tuple(batch[name] for name in self.input_names)

    def describe(self) -> dict[str, Any]:
        return {
            "inputs": {n: _spec_record(s) for n, s in self.input_specs.items()},
            "outputs": list(self.output_names),
            "components": [f"{c.name} ({type(c).__name__})" for c in self.components],
        }


def _spec_record(spec: StreamSpec) -> dict[str, Any]:
    return {
        "shape": [str(d) for d in spec.dims] if spec.dims is not None else None,
        "dtype": [str(t).replace("torch.", "") for t in spec.dtypes] if spec.dtypes else None,
        "description": spec.description,
    }


def _check_tensor_streams(component: Component, tensor_streams: list[str]) -> None:
    for direction, specs in (
        ("reads", component.input_specs()),
        ("writes", component.output_specs()),
    ):
        for key, spec in specs.items():
            if not is_tensor_spec(spec):
                kinds = ", ".join(getattr(t, "__name__", str(t)) for t in spec.dtypes or ())
                raise DeployError.at(
                    "",
                    component.label,
                    f"{direction} '{component.stream_name(key)}' ({kinds}, not tensors): "
                    "a graph of tensors cannot hold it",
                    "start the graph after it with --inputs, naming tensor streams "
                    f"it leads to ({', '.join(tensor_streams) or 'none'}), and "
                    "reproduce this step in the deployment's own code",
                )


def replaced(graph: InferenceGraph, substitutes: dict[str, nn.Module]) -> InferenceGraph:
    """A copy of `graph` that runs `substitutes` (by component name) in place of those
    components; the others are shared."""
    twin = InferenceGraph.__new__(InferenceGraph)
    nn.Module.__init__(twin)
    twin.input_names, twin.output_names = graph.input_names, graph.output_names
    twin.input_specs = graph.input_specs
    routes = [(substitutes.get(c.name, c), i, o) for c, i, o in graph._routes]
    twin.components = nn.ModuleList([module for module, _, _ in routes])
    twin.chosen = graph.chosen
    twin._routes = routes  # type: ignore[assignment]
    return twin


def task_batch(pipeline: Pipeline, section: str, size: int) -> Batch:
    """The first `size` samples of a section's task (fewer when it has fewer), collated, with
    pipeline-wide stream names."""
    task = pipeline.tasks[section]
    task.prepare()
    count = min(size, len(task))
    if count == 0:
        raise DeployError.at("", f"section '{section}'", "its task has no samples")
    return pipeline.rename_task_outputs(section, task.fetch(list(range(count))))


def upstream_components(pipeline: Pipeline, section: str, graph: InferenceGraph) -> list[Component]:
    """The components, in order, that turn the task's streams into the graph's inputs when the
    graph starts after the task (`--inputs`): what a deployment must reproduce itself."""
    task = pipeline.tasks[section]
    task_streams = {task.stream_name(k) for k in task.output_specs()}
    needed = set(graph.input_names) - task_streams
    found: list[Component] = []
    for component in reversed(list(pipeline.components.values())):
        if isinstance(component, (Loss, Statistic)) or component in graph.chosen:
            continue
        if {component.stream_name(k) for k in component.output_specs()} & needed:
            found.append(component)
            needed |= {component.stream_name(k) for k in component.input_specs()}
    return found[::-1]


def model_graph(pipeline: Pipeline, section: str) -> InferenceGraph:
    """The graph to time and compare models on: from the task's streams when the pipeline
    is all tensors, else from the streams the models read (after a tokenizer, say)."""
    try:
        return InferenceGraph(pipeline, section)
    except DeployError:
        models = [c for c in pipeline.components.values() if isinstance(c, Model)]
        from_models = {c.stream_name(k) for c in models for k in c.output_specs()}
        starts = [
            c.stream_name(k)
            for c in models
            for k in c.input_specs()
            if c.stream_name(k) not in from_models
        ]
        return InferenceGraph(pipeline, section, inputs=list(dict.fromkeys(starts)))


def graph_batch(pipeline: Pipeline, section: str, graph: InferenceGraph, size: int) -> Batch:
    """A batch of the task with every stream the graph starts from (components before the
    graph run on it when it does not start at the task)."""
    batch = task_batch(pipeline, section, size)
    if any(name not in batch for name in graph.input_names):
        with torch.no_grad():
            pipeline(batch)
    return batch
