"""The graph inputs of raw texts for `loom predict` on an export that starts after python-side
components (`loom export --inputs`): those components (tokenizer, indexer, encoder) are built
again from the sidecar's record (type, parameters, globals, stream names), an indexer reading
the vocabulary the export carries, and run on the texts. The model itself runs in ONNX
Runtime; this part needs torchloom, as the sidecar says. The sidecar may make it read only the
export's own files (sidecar_files.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchloom.core.registry import resolve
from torchloom.core.weights import WeightsMatch, first_names, read_weights_file
from torchloom.deploy.sidecar_files import (
    ARTIFACT_PARAMETERS,
    check_files_before_graph,
    own_artifact,
)
from torchloom.deploy.tensor_files import tensors_of
from torchloom.errors import DeployError


def text_feed(folder: Path, record: dict[str, Any], texts: list[str]) -> dict[str, np.ndarray]:
    """{graph input name: array} for `texts`, through the components before the graph."""
    steps = record.get("before_graph") or []
    if not steps:
        raise DeployError.at(
            "",
            f"'{folder / 'sidecar.json'}'",
            "records no components before the graph to turn texts into its inputs",
        )
    check_files_before_graph(folder, steps)  # a received export: before anything is read
    task_input = next(iter(steps[0]["streams"].values()))
    batch: dict[str, Any] = {task_input: list(texts)}
    for index, step in enumerate(steps):
        component = rebuilt(folder, step)
        names = step["streams"]
        if index == 0:
            _reads_texts(component, folder, names)
        inputs = {key: batch[names.get(key, key)] for key in component.input_specs()}
        with torch.no_grad():
            outputs = component(inputs)
        for key, value in outputs.items():
            batch[names.get(key, key)] = value
    feed = {}
    for entry in record["inputs"]:
        value = batch.get(entry["name"])
        if not isinstance(value, torch.Tensor):
            raise DeployError.at(
                "", "sidecar.json", f"no tensor '{entry['name']}' after its components"
            )
        feed[entry["name"]] = value.detach().cpu().numpy()
    return feed


def rebuilt(folder: Path, step: dict[str, Any], trained: bool = True) -> Any:
    """A component before the graph built again from its sidecar record, in eval mode: its
    vocabulary read from the export's copy and, when the export carries them (`trained`), the
    weights the run trained it to (`weights`, written by upstream_weights.py)."""
    params = dict(step["params"])
    for parameter, artifact in ARTIFACT_PARAMETERS.items():
        own = own_artifact(step["artifacts"], artifact)
        if own is not None and parameter in params:
            params[parameter] = str(folder / own)
    component = resolve(step["type"]).create(name=step["name"], globals=step["globals"], **params)
    if trained and step.get("weights"):
        _load_trained(component, folder / step["weights"], step)
    component.eval()
    return component


def _load_trained(component: Any, path: Path, step: dict[str, Any]) -> None:
    """Every tensor of the component from `path`, exactly (the export wrote each name),
    matched by name and shape as a checkpoint's are (core/weights.WeightsMatch)."""
    name = step["name"]
    who = f"component '{name}' ({step['type']})"
    weights = read_weights_file(path, f"'{path}'", who)
    match = WeightsMatch()
    match.add(name, tensors_of(component.state_dict()), weights)
    missing, unexpected = match.missing[name], match.unexpected[name]
    differ = [f"missing {first_names(missing)}"] if missing else []
    differ += [f"not its own {first_names(unexpected)}"] if unexpected else []
    differ += [f"{key} of shape {given}, not {own}" for key, given, own in match.mismatched[name]]
    if differ:
        raise DeployError.at("", f"'{path}'", f"does not hold {who}'s weights: {'; '.join(differ)}")
    component.load_state_dict(weights, strict=False)  # its extra state is not in the file


def _reads_texts(component: Any, folder: Path, names: dict[str, str]) -> None:
    """The first component must read one text per sample: one that reads the tokens the task
    cut (a language model's indexer) would get a text's characters as its tokens."""
    for key, spec in component.input_specs().items():
        if spec.dims is None or len(spec.dims) != 1 or spec.dtypes != (str,):
            raise DeployError.at(
                "",
                component.label,
                f"reads the task's tokens ('{names.get(key, key)}', "
                f"{spec.description}), not one raw text per input: `loom predict` cannot "
                "cut a text as the task did",
                f"feed the export's inputs from your own code (see {folder / 'sidecar.json'})",
            )
