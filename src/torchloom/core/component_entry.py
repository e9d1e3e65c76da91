"""Reading one component's config entry: its type, renames, priority, freeze, load and params.

Keys a pipeline reserves for itself sit beside the component's own parameters; everything
else is validated against the component's pydantic `Params`, so a misspelt parameter is an
error with a suggestion, never silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from torchloom.core.component import Component, ComponentParams, Task
from torchloom.core.registry import resolve
from torchloom.errors import LoomError, Problem, Where, did_you_mean, validation_problems

RESERVED_KEYS = ("type", "streams", "globals", "dims", "priority", "freeze", "load")


@dataclass(frozen=True)
class LoadSpec:
    """Pretrained weights for one component: a file, a key inside it, prefix renames."""

    file: str
    key: str | None = None
    prefix_map: Mapping[str, str] = field(default_factory=dict)
    strict: bool = True


@dataclass
class ComponentEntry:
    """A parsed, validated config entry, not yet built."""

    name: str
    key_path: tuple[str, ...]  # where it sits in the config, e.g. ("pipeline", "lenet")
    cls: type[Component]
    params: ComponentParams
    stream_names: dict[str, str]
    global_names: dict[str, str]
    priority: float | None = None
    freeze: bool = False
    load: LoadSpec | None = None
    index: int = 0  # declaration order, the last tie-break
    dim_names: dict[str, str] = field(default_factory=dict)  # `dims:` renames

    @property
    def label(self) -> str:
        return f"component '{self.name}' ({self.cls.__name__})"

    def needed(self) -> dict[str, str]:
        """Actual global name -> default name, for the globals this entry reads."""
        return {self.global_names.get(k, k): k for k in self.cls.needed_globals(self.params)}

    def published(self) -> dict[str, str]:
        return {self.global_names.get(k, k): k for k in self.cls.published_globals(self.params)}


def _string_mapping(
    value: Any, key: str, where: str, subject: str
) -> tuple[dict[str, str], list[Problem]]:
    if value is None:
        return {}, []
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        return {}, [
            Problem(
                where,
                subject,
                f"'{key}' must map default names to new names (strings), got {value!r}",
            )
        ]
    return dict(value), []


def _parse_load(value: Any, where: str, subject: str) -> tuple[LoadSpec | None, list[Problem]]:
    if value is None:
        return None, []
    if isinstance(value, str):
        return LoadSpec(file=value), []
    allowed = {"file", "key", "prefix_map", "strict"}
    if isinstance(value, Mapping) and isinstance(value.get("file"), str):
        unknown = [k for k in value if k not in allowed]
        if unknown:
            return None, [
                Problem(
                    where,
                    subject,
                    f"unknown key '{unknown[0]}' in 'load'",
                    did_you_mean(unknown[0], allowed),
                )
            ]
        prefix_map, problems = _string_mapping(
            value.get("prefix_map"), "load.prefix_map", where, subject
        )
        key = value.get("key")
        if key is not None and not isinstance(key, str):
            problems.append(Problem(where, subject, f"'load.key' must be a string, got {key!r}"))
        return LoadSpec(value["file"], key, prefix_map, bool(value.get("strict", True))), problems
    return None, [
        Problem(
            where,
            subject,
            "'load' must be a file path or a mapping with 'file' "
            f"(and optional 'key', 'prefix_map', 'strict'), got {value!r}",
        )
    ]


def parse_entry(
    name: str,
    raw: Any,
    key_path: tuple[str, ...],
    where: Where,
    index: int,
    is_task: bool,
    unusable: set[str] | None = None,
) -> tuple[ComponentEntry | None, list[Problem]]:
    """Validate one component entry; returns the entry (None if unusable) and its problems.
    `is_task`: whether the slot takes a Task (a section's `task`) or any other component.
    An entry unusable for its parameters adds the globals its class publishes to `unusable`
    (its readers' "no component publishes" would only repeat its problem)."""
    here = where(*key_path)
    subject = f"component '{name}'"
    if not isinstance(raw, Mapping):
        return None, [Problem(here, subject, f"expected a mapping with a 'type' key, got {raw!r}")]
    if "type" not in raw:
        return None, [
            Problem(
                here,
                subject,
                "has no 'type'",
                "add e.g. `type: LeNet5`; `loom components` lists them",
            )
        ]
    try:
        cls = resolve(raw["type"], where(*key_path, "type"))
    except LoomError as error:
        return None, [
            Problem(p.where, f"{subject}: {p.subject}", p.message, p.suggestion)
            for p in error.problems
        ]
    subject = f"component '{name}' ({cls.__name__})"
    # The family first: parameter errors of a component in the wrong slot only mislead.
    if is_task and not issubclass(cls, Task):
        return None, [
            Problem(
                where(*key_path, "type"),
                subject,
                f"is a {cls.family}, not a task",
                "a section's `task` names a data source such as MNIST",
            )
        ]
    if not is_task and issubclass(cls, Task):
        return None, [
            Problem(
                where(*key_path, "type"),
                subject,
                "is a task: put it under training.task / validation.task / test.task",
            )
        ]
    problems: list[Problem] = []
    streams, found = _string_mapping(
        raw.get("streams"), "streams", where(*key_path, "streams"), subject
    )
    problems += found
    global_names, found = _string_mapping(
        raw.get("globals"), "globals", where(*key_path, "globals"), subject
    )
    problems += found
    dim_names, found = _string_mapping(raw.get("dims"), "dims", where(*key_path, "dims"), subject)
    problems += found
    priority = raw.get("priority")
    if priority is not None and (
        isinstance(priority, bool) or not isinstance(priority, (int, float))
    ):
        problems.append(
            Problem(
                where(*key_path, "priority"),
                subject,
                f"'priority' must be a number, got {priority!r}",
            )
        )
        priority = None
    freeze = raw.get("freeze", False)
    if not isinstance(freeze, bool):
        problems.append(
            Problem(
                where(*key_path, "freeze"),
                subject,
                f"'freeze' must be true or false, got {freeze!r}",
            )
        )
        freeze = False
    load, found = _parse_load(raw.get("load"), where(*key_path, "load"), subject)
    problems += found
    param_values = {k: v for k, v in raw.items() if k not in RESERVED_KEYS}
    try:
        params = cls.Params(**param_values)
    except ValidationError as error:
        if unusable is not None:
            unusable.update(global_names.get(k, k) for k in cls.PUBLISHES_GLOBALS)
        found = validation_problems(
            error,
            where,
            key_path,
            cls.Params,
            also_known=RESERVED_KEYS,
            component=subject,
            owner=cls.__name__,
        )
        return None, problems + found
    entry = ComponentEntry(
        name,
        key_path,
        cls,
        params,
        streams,
        global_names,
        float(priority) if priority is not None else None,
        freeze,
        load,
        index,
        dim_names,
    )
    return entry, problems
