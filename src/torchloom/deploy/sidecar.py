"""What a deployment needs besides the graph, as JSON (`sidecar.json` next to the export):
how the task turned raw inputs into the graph's input tensors (image size, normalisation) and
what the outputs mean (label names, log-probabilities or logits). `loom predict` reads only
this file and the ONNX model.
"""

from __future__ import annotations

from typing import Any

from torchloom.core.component import Component, Task
from torchloom.core.pipeline import Pipeline
from torchloom.deploy.graph import InferenceGraph, upstream_components

SIDECAR_VERSION = 1


def _image_preprocessing(task: Task) -> dict[str, Any] | None:
    transformer = getattr(task, "transformer", None)
    if transformer is None or not hasattr(transformer, "depth"):
        return None
    normalization = transformer.normalization
    transforms = transformer.transforms
    if transforms.normalize is not None:
        normalization = transforms.normalize
    depth = int(transformer.depth)
    final = [int(transformer.height), int(transformer.width)]
    # A task that resizes each file as it reads it (ImageFolder's image_size) and again in
    # its transforms resizes twice: predicting with the last size alone fed other pixels.
    read = getattr(task, "read_size", None)
    steps = [list(read), final] if read is not None and list(read) != final else [final]
    return {
        "kind": "image",
        "depth": depth,
        "height": final[0],
        "width": final[1],
        "resizes": steps,  # [height, width] of each bilinear resize, in order
        # Pixels are resized (bilinear) to each size in turn, divided by 255, standardised.
        "scale": 1.0 / 255.0,
        "normalize": None
        if normalization is None
        else {
            "mean": _per_channel(list(normalization.mean), depth),
            "std": _per_channel(list(normalization.std), depth),
        },
        "layout": "NCHW",
    }


def _per_channel(values: list[float], depth: int) -> list[float]:
    return values * depth if len(values) == 1 else values


def _output_kind(pipeline: Pipeline, name: str, description: str) -> str:
    """What an output holds: its description's word, else what the loss trained on it reads
    (a model with `log_softmax: false` describes its output as plain 'outputs', but a
    CrossEntropyLoss on it makes them logits; an NLLLoss, log-probabilities)."""
    from torchloom.zoo.losses import CrossEntropyLoss, NLLLoss

    if "log-prob" in description:
        return "log-probabilities"
    if "logit" in description:
        return "logits"
    for component in pipeline.components.values():
        if (
            isinstance(component, (NLLLoss, CrossEntropyLoss))
            and not component.params.sequence
            and component.stream_name("predictions") == name
        ):
            return "log-probabilities" if isinstance(component, NLLLoss) else "logits"
    return "values"


def _output_labels(component: Component, key: str, class_names: list[str] | None) -> Any:
    """The task's class names for an output [batch, classes] over the task's classes; None for
    any other (a parity head renames its two classes with `dims:`, they are not the digits)."""
    spec = component.pipeline_specs(component.output_specs())[key]
    dims = spec.dims or ()
    if class_names and len(dims) == 2 and dims[-1].name == "classes":
        return list(class_names)
    return None


def sidecar(pipeline: Pipeline, section: str, graph: InferenceGraph) -> dict[str, Any]:
    task = pipeline.tasks[section]
    class_names = getattr(task, "class_names", None)
    outputs = []
    for name in graph.output_names:
        description, labels = "", None
        for component in graph.chosen:
            for key, spec in component.output_specs().items():
                if component.stream_name(key) == name:
                    description = spec.description
                    labels = _output_labels(component, key, class_names)
        kind = _output_kind(pipeline, name, description)
        outputs.append({"name": name, "description": description, "kind": kind, "labels": labels})
    task_streams = {task.stream_name(k) for k in task.output_specs()}
    preprocessing = _image_preprocessing(task) if set(graph.input_names) <= task_streams else None
    upstream = upstream_components(pipeline, section, graph)
    return {
        "version": SIDECAR_VERSION,
        "task": type(task).__name__,
        "inputs": [{"name": name, **record} for name, record in graph.describe()["inputs"].items()],
        "preprocessing": preprocessing or {"kind": "tensors", "note": "no raw-input recipe"},
        # Components before the graph (tokenizers, vocabularies): their settings, and the
        # files they were built with, copied to artifacts/<name>/ next to this file.
        "before_graph": [
            {
                "name": c.name,
                "type": type(c).__name__,
                "params": c.params.model_dump(mode="json"),
                "artifacts": [f"artifacts/{c.name}/{f}" for f in c.artifacts()],
                # default stream name -> the pipeline's, and the globals it was built with
                "streams": {k: c.stream_name(k) for k in [*c.input_specs(), *c.output_specs()]},
                "globals": _plain_globals(c),
            }
            for c in upstream
        ],
        "outputs": outputs,
        # The task's class names; each output's own "labels" are those that name its classes.
        "labels": list(class_names) if class_names else None,
        "components": graph.describe()["components"],
    }


def _plain_globals(component: Component) -> dict[str, Any]:
    """The needed globals whose values JSON holds as they are (sizes, names)."""
    found = {}
    for key in type(component).needed_globals(component.params):
        value = component.global_value(key)
        if isinstance(value, (int, float, str, bool)):
            found[key] = value
    return found
