"""The weights of the components before an export's graph (`loom export --inputs`): `loom
predict` builds those components again from the sidecar's record (text_inputs.py), which gives
them the weights they are built with (a pretrained encoder's package). A component the run
trained (a fine-tuned encoder) would silently lose what it learned: its weights are written
next to the sidecar, and only where a rebuild differs from the run's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from torchloom.core.component import Component
from torchloom.core.weights import first_names
from torchloom.deploy.tensor_files import tensors_of, write_tensors
from torchloom.deploy.text_inputs import rebuilt
from torchloom.errors import DeployError

WEIGHTS_ARTIFACT = "weights.safetensors"


def carry_trained_weights(
    folder: Path, record: dict[str, Any], upstream: list[Component]
) -> list[str]:
    """Write the weights of each component of `record["before_graph"]` whose rebuild from that
    record (with its vocabulary, already in `folder`) differs from the run's, and name them
    in the record (`weights`); returns the components whose weights were written."""
    carried = []
    for step, component in zip(record["before_graph"], upstream, strict=True):
        trained = tensors_of(component.state_dict())
        if not trained:
            continue
        try:
            built = tensors_of(rebuilt(folder, step, trained=False).state_dict())
        except Exception as error:  # whatever the component's constructor raises
            raise DeployError.at(
                "",
                component.label,
                f"cannot be built again from its record in sidecar.json ({error}), as `loom "
                "predict` builds it",
            ) from error
        if built.keys() != trained.keys():
            differ = first_names(sorted(built.keys() ^ trained.keys()))
            raise DeployError.at(
                "",
                component.label,
                "built again from its record in sidecar.json, as `loom predict` builds it, has "
                f"other weights ({differ}): the deployment could not give it the run's",
                "start the graph before it with --inputs, so that the graph holds it",
            )
        if all(torch.equal(built[k], v.detach().cpu()) for k, v in trained.items()):
            continue
        relative = f"artifacts/{component.name}/{WEIGHTS_ARTIFACT}"
        write_tensors(trained, folder / relative, aliases=True)  # every name: a strict load
        step["weights"] = relative
        carried.append(component.name)
    return carried
