"""`load:` — pretrained weights for one component, from a file another pipeline wrote.

Files are read with `torch.load(weights_only=True)` (no pickled code runs) or safetensors.
`key` selects a part of the file: a dotted path into nested dicts (a torchloom checkpoint
keeps `components -> name -> state_dict`), or, for a flat state dict, every entry under that
prefix. `prefix_map` then renames key prefixes (`{"encoder.": ""}`) so that weights trained
inside one model can be transplanted into another.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from torchloom.core.component import Component
from torchloom.core.component_entry import LoadSpec
from torchloom.errors import Problem, WeightsError


def read_weights_file(path: Path, where: str, subject: str) -> Mapping[str, Any]:
    if not path.is_file():
        raise WeightsError([Problem(where, subject, f"weights file '{path}' does not exist")])
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # unreadable, or pickled code: never load it unsafely
        raise WeightsError(
            [
                Problem(
                    where,
                    subject,
                    f"cannot read weights file '{path}': it is not a state dict of tensors "
                    "(torchloom never unpickles code, so `weights_only=False` is no option)",
                    "save weights with torch.save(model.state_dict(), path) or safetensors",
                )
            ]
        ) from error
    if not isinstance(loaded, Mapping):
        raise WeightsError(
            [Problem(where, subject, f"'{path}' holds a {type(loaded).__name__}, not a state dict")]
        )
    return loaded


def _select(data: Mapping[str, Any], key: str, where: str, subject: str) -> Mapping[str, Any]:
    node: Any = data
    for part in key.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        else:
            node = None
            break
    if isinstance(node, Mapping):
        return node
    prefix = key + "."
    flat = {
        k[len(prefix) :]: v for k, v in data.items() if isinstance(k, str) and k.startswith(prefix)
    }
    if flat:
        return flat
    tops = ", ".join(sorted(str(k) for k in data)[:8])
    raise WeightsError(
        [
            Problem(
                where,
                subject,
                f"key '{key}' not found in the weights file",
                f"its top-level keys: {tops}",
            )
        ]
    )


def load_weights(component: Component, spec: LoadSpec, where: str) -> None:
    subject = component.label
    path = Path(spec.file).expanduser()
    state = read_weights_file(path, where, subject)
    if spec.key:
        state = _select(state, spec.key, where, subject)
    renamed: dict[str, Any] = {}
    for name, value in state.items():
        for old, new in spec.prefix_map.items():
            if name.startswith(old):
                name = new + name[len(old) :]
                break
        renamed[name] = value
    own = component.state_dict()
    problems = []
    for name, value in renamed.items():
        if name in own and isinstance(value, torch.Tensor) and value.shape != own[name].shape:
            problems.append(
                Problem(
                    where,
                    subject,
                    f"weight '{name}' has shape "
                    f"{list(value.shape)} in '{path}' but {list(own[name].shape)} "
                    "in the component",
                )
            )
    missing = sorted(set(own) - set(renamed))
    unexpected = sorted(set(renamed) - set(own))
    if spec.strict and missing:
        problems.append(
            Problem(
                where,
                subject,
                f"'{path}' lacks {len(missing)} weights: {', '.join(missing[:6])}",
                "check 'key' and 'prefix_map', or set `strict: false`",
            )
        )
    if spec.strict and unexpected:
        problems.append(
            Problem(
                where,
                subject,
                f"'{path}' has {len(unexpected)} weights the "
                f"component lacks: {', '.join(unexpected[:6])}",
                "check 'key' and 'prefix_map', or set `strict: false`",
            )
        )
    if problems:
        raise WeightsError(problems)
    component.load_state_dict(renamed, strict=spec.strict)
