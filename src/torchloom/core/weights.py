"""`load:` — pretrained weights for one component, from a file another pipeline wrote.

Files are read with `torch.load(weights_only=True)` (no pickled code runs) or safetensors.
`key` selects a part of the file: a dotted path into nested dicts (a torchloom checkpoint
keeps `components -> name -> state_dict`), or, for a flat state dict, every entry under that
prefix. `prefix_map` then renames key prefixes (`{"encoder.": ""}`) so that weights trained
inside one model can be transplanted into another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from torchloom.core.component import Component
from torchloom.core.component_entry import LoadSpec
from torchloom.errors import Problem, WeightsError


def read_weights_file(path: Path, where: str, subject: str) -> Mapping[str, Any]:
    if not path.is_file():
        raise WeightsError.at(where, subject, f"weights file '{path}' does not exist")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # unreadable, or pickled code: never load it unsafely
        raise WeightsError.at(
            where,
            subject,
            f"cannot read weights file '{path}': it is not a state dict of tensors "
            "(torchloom never unpickles code, so `weights_only=False` is no option)",
            "save weights with torch.save(model.state_dict(), path) or safetensors",
        ) from error
    if not isinstance(loaded, Mapping):
        raise WeightsError.at(
            where, subject, f"'{path}' holds a {type(loaded).__name__}, not a state dict"
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
    raise WeightsError.at(
        where, subject, f"key '{key}' not found in the weights file", f"its top-level keys: {tops}"
    )


@dataclass
class WeightsMatch:
    """How a source of weights (a checkpoint, a `load:` file) fits one or more components:
    per component, the keys it loads, the keys the source lacks, and the source's keys the
    component lacks. Shape mismatches are never loaded: they are errors (`shape_problems`)."""

    loaded: dict[str, list[str]] = field(default_factory=dict)
    missing: dict[str, list[str]] = field(default_factory=dict)
    unexpected: dict[str, list[str]] = field(default_factory=dict)
    mismatched: dict[str, list[tuple[str, list[int], list[int]]]] = field(default_factory=dict)
    # Components with weights in a checkpoint that the pipeline does not have.
    extra_components: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(len(keys) for keys in self.loaded.values())

    @property
    def complete(self) -> bool:
        lists = (*self.missing.values(), *self.unexpected.values(), *self.mismatched.values())
        return not any(lists) and not self.extra_components

    def add(
        self,
        name: str,
        own: Mapping[str, Any],
        given: Mapping[str, Any],
        optional: frozenset[str] = frozenset(),
    ) -> None:
        """Match one component's state dict (`own`) against the source's entry (`given`);
        `optional` keys are loaded when given and not missed when not (OPTIONAL_STATE)."""
        loaded, mismatched = [], []
        for key, value in given.items():
            if key not in own:
                continue
            tensors = isinstance(value, torch.Tensor) and isinstance(own[key], torch.Tensor)
            if tensors and value.shape != own[key].shape:
                mismatched.append((key, list(value.shape), list(own[key].shape)))
                continue
            loaded.append(key)
        self.loaded[name] = loaded
        self.missing[name] = sorted(set(own) - set(given) - optional)
        self.unexpected[name] = sorted(set(given) - set(own))
        self.mismatched[name] = mismatched

    def shape_problems(self, labels: Mapping[str, str], where: str, source: str) -> list[Problem]:
        return [
            Problem(
                where,
                labels.get(name, f"component '{name}'"),
                f"weight '{key}' has shape {given} in {source} but {own} in the component",
                "the source was trained with other sizes (another config?)",
            )
            for name, shapes in self.mismatched.items()
            for key, given, own in shapes
        ]

    def incomplete_problems(
        self, labels: Mapping[str, str], where: str, source: str, suggestion: str
    ) -> list[Problem]:
        problems = []
        for name in self.loaded:
            subject = labels.get(name, f"component '{name}'")
            missing, unexpected = self.missing[name], self.unexpected[name]
            if missing:
                message = f"{source} lacks {len(missing)} weights: {first_names(missing)}"
                problems.append(Problem(where, subject, message, suggestion))
            if unexpected:
                lacked = first_names(unexpected)
                message = f"{source} has {len(unexpected)} weights the component lacks: {lacked}"
                problems.append(Problem(where, subject, message, suggestion))
        return problems

    def report(self) -> dict[str, Any]:
        """What was loaded and what was not, per component: for summaries and run.log."""
        return {
            "complete": self.complete,
            "components": {
                name: {
                    "loaded": keys,
                    "not_loaded": self.missing[name],
                    "ignored": self.unexpected[name],
                }
                for name, keys in self.loaded.items()
            },
            "ignored_components": self.extra_components,
        }


def first_names(keys: list[str], shown: int = 6) -> str:
    """The first `shown` of `keys` for a message, and how many more."""
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return ", ".join(keys[:shown]) + more


def with_weights(components: Mapping[str, Component]) -> dict[str, dict[str, Any]]:
    """The state dicts of the components that have any (models; a task or a loss has none)."""
    states = {name: c.state_dict() for name, c in components.items()}
    return {name: state for name, state in states.items() if state}


def load_pipeline_weights(
    components: Mapping[str, Component],
    source: Mapping[str, Any],
    source_name: str,
    strict: bool = True,
    where: str = "",
) -> WeightsMatch:
    """Load a checkpoint's `components` mapping into a pipeline's components, matching names,
    keys and shapes first (`match_pipeline_weights`). Loads nothing unless the check passes."""
    match = match_pipeline_weights(components, source, source_name, strict, where)
    for name, keys in match.loaded.items():
        given = source[name] if isinstance(source.get(name), Mapping) else {}
        components[name].load_state_dict({k: given[k] for k in keys}, strict=False)
    return match


def match_pipeline_weights(
    components: Mapping[str, Component],
    source: Mapping[str, Any],
    source_name: str,
    strict: bool = True,
    where: str = "",
) -> WeightsMatch:
    """How a checkpoint's `components` mapping fits a pipeline's components. Nothing matching
    is always an error (the run would use untrained weights); a partial match is one unless
    `strict` is False; a shape mismatch always is (naming component, weight, both shapes)."""
    expected = with_weights(components)
    match = WeightsMatch()
    for name, own in expected.items():
        given = source.get(name)
        # State a component began to keep later (a class's OPTIONAL_STATE): a checkpoint
        # from before it lacks it, and the component loads it without (its own pre-hook).
        optional: frozenset[str] = getattr(components[name], "OPTIONAL_STATE", frozenset())
        match.add(name, own, given if isinstance(given, Mapping) else {}, optional)
    match.extra_components = sorted(
        str(name)
        for name, state in source.items()
        if name not in expected and isinstance(state, Mapping) and state
    )
    labels = {name: components[name].label for name in expected}
    if match.count == 0 and not any(match.mismatched.values()):
        raise WeightsError.at(
            where,
            source_name,
            "holds none of this pipeline's weights (components with weights: "
            f"{', '.join(expected) or 'none'}; the checkpoint's components: "
            f"{', '.join(str(k) for k in source) or 'none'})",
            "is it a checkpoint of this pipeline? `load:` with `key` and `prefix_map` "
            "transplants parts of another one",
        )
    problems = match.shape_problems(labels, where, source_name)
    if strict:
        hint = "to load only what matches, pass --checkpoint-strict false (or `strict: false`)"
        problems += match.incomplete_problems(labels, where, source_name, hint)
        problems += [
            Problem(where, source_name, f"has weights for '{name}', not in this pipeline", hint)
            for name in match.extra_components
        ]
    if problems:
        raise WeightsError(problems)
    return match


def load_weights(component: Component, spec: LoadSpec, where: str) -> WeightsMatch:
    """`load:` for one component; notes on the component what a non-strict load left out."""
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
    match = WeightsMatch()
    match.add(component.name, component.state_dict(), renamed)
    labels = {component.name: subject}
    source = f"'{path}'" + (f" (key '{spec.key}')" if spec.key else "")
    hint = "check 'key' and 'prefix_map', or set `strict: false`"
    problems = match.shape_problems(labels, where, source)
    if match.count == 0 and not problems:
        problems.append(
            Problem(
                where,
                subject,
                f"{source} holds none of its weights (its first keys: "
                f"{first_names(sorted(str(k) for k in renamed)) or 'none'}; the component's: "
                f"{first_names(sorted(component.state_dict()))})",
                hint,
            )
        )
    if spec.strict:
        problems += match.incomplete_problems(labels, where, source, hint)
    if problems:
        raise WeightsError(problems)
    component.load_state_dict({k: renamed[k] for k in match.loaded[component.name]}, strict=False)
    if not match.complete:
        component.note(
            f"load: {match.count} weights from {source}; not loaded (strict: false): "
            f"{first_names(match.missing[component.name]) or 'none'}; ignored from the file: "
            f"{first_names(match.unexpected[component.name]) or 'none'}"
        )
    return match
