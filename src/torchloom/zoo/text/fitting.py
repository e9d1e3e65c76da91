"""What the text components that build their vocabulary (or label set) from the training data
share: the training task's values of a stream, and the errors naming the component's key.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torchloom.core.component import Component
from torchloom.errors import ComponentError, Problem, did_you_mean


def fit_error(component: Component, key: str, message: str, suggestion: str = "") -> ComponentError:
    """A ComponentError at the config key `key` of `component` (its line when not set)."""
    where = component.where(key) if key else component.where()
    return ComponentError([Problem(where, component.label, message, suggestion)])


def training_values(component: Component, stream: str, key: str, otherwise: str) -> Iterator[Any]:
    """Every training sample's value of `stream` (the task's default or renamed name), or a
    ComponentError at the config key `key` when there is no training task (suggesting
    `otherwise`) or no such stream."""
    task = component.training_task()
    if task is None:
        message = "has nothing to build from: the config has no training task"
        raise fit_error(component, key, message, otherwise)
    outputs = task.output_specs()
    renamed = {task.stream_name(name): name for name in outputs}
    default = renamed.get(stream, stream if stream in outputs else None)
    if default is None:
        message = f"the training task ({type(task).__name__}) has no stream '{stream}'"
        streams = did_you_mean(stream, renamed) or f"its streams: {', '.join(sorted(renamed))}"
        raise fit_error(component, key, message, streams)
    return task.texts(default)


def refuse_other_entries(
    component: Component, what: str, saved: tuple[str, ...], own: tuple[str, ...]
) -> ComponentError:
    """The error for a checkpoint whose vocabulary (or label set) is not the one built."""
    first = next((i for i, (a, b) in enumerate(zip(saved, own, strict=False)) if a != b), None)
    detail = (
        f"entry {first} is '{saved[first]}' there but '{own[first]}' here"
        if first is not None
        else f"{len(saved)} entries there, {len(own)} here"
    )
    return fit_error(
        component,
        "",
        f"the checkpoint's {what} differs from the one built ({detail}), so its weights "
        "would mean other words",
        "build from the same training data, or point the component at the "
        f"{what} file the run saved in <run>/artifacts/{component.name}/",
    )
