"""The base of every pydantic schema a config fills: a YAML boolean is never read as a number.

pydantic's lax mode takes `true` for 1 and `false` for 0 in an int or float field, so
`batch_size: true`, `hidden_sizes: [true, 20]` or `epoch_limit: true` trained with 1, and
`dropout: false` with 0.0, without a word. Lax mode stays for everything else (a YAML string
for a path, an int for a float); a boolean given where the field takes numbers but no boolean
is refused, in lists, tuples and mappings of numbers too.
"""

from __future__ import annotations

import os
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Union

from pydantic import BaseModel, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError


def refuse_a_boolean_for_a_number(cls: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
    """A field validator (mode "before"): `value` as it is, or an error when it is a boolean
    where the field takes numbers."""
    field = cls.model_fields.get(info.field_name or "")
    if field is not None and boolean_for_a_number(field.annotation, value):
        raise PydanticCustomError(
            "boolean_for_a_number",
            "Input should be a number, not a boolean (true/false): write the number",
        )
    return value


class ConfigModel(BaseModel):
    """A schema whose number fields refuse booleans (see the module's docstring). A class
    that is a member of a discriminated union cannot derive from it (pydantic refuses a
    "before" validator on the tag field): it names its number fields to
    `refuse_a_boolean_for_a_number` instead (config/sampler_schema.py)."""

    _no_boolean_for_a_number = field_validator("*", mode="before")(refuse_a_boolean_for_a_number)


def boolean_for_a_number(annotation: Any, value: Any) -> bool:
    """Whether `value` is (or holds, in a list, tuple or mapping) a boolean where
    `annotation` takes a number and no boolean."""
    if isinstance(value, bool):
        leaves = _leaves(annotation)
        return _takes_a_number(leaves) and not _takes_a_boolean(leaves)
    if isinstance(value, Mapping):
        values = _item_types(annotation, mapping=True)
        return bool(values) and any(boolean_for_a_number(values, v) for v in value.values())
    if isinstance(value, (list, tuple)):
        items = _item_types(annotation, mapping=False)
        return bool(items) and any(boolean_for_a_number(items, v) for v in value)
    return False


def _leaves(annotation: Any) -> list[Any]:
    """The alternatives of a union (Optional, `X | Y`), Annotated unwrapped; `annotation`
    may also be a list of them."""
    if isinstance(annotation, list):
        return [leaf for part in annotation for leaf in _leaves(part)]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _leaves(typing.get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [leaf for part in typing.get_args(annotation) for leaf in _leaves(part)]
    return [annotation]


def _takes_a_number(leaves: list[Any]) -> bool:
    return any(
        leaf in (int, float)
        or (
            typing.get_origin(leaf) is Literal
            and any(type(v) in (int, float) for v in typing.get_args(leaf))
        )
        for leaf in leaves
    )


def _takes_a_boolean(leaves: list[Any]) -> bool:
    return any(
        leaf in (bool, Any, object)
        or (
            typing.get_origin(leaf) is Literal
            and any(isinstance(v, bool) for v in typing.get_args(leaf))
        )
        for leaf in leaves
    )


def _item_types(annotation: Any, mapping: bool) -> list[Any]:
    """The element types of the list, tuple or sequence alternatives of `annotation` (the
    value types of its mapping alternatives when `mapping`)."""
    items = []
    for leaf in _leaves(annotation):
        origin = typing.get_origin(leaf)
        args = [a for a in typing.get_args(leaf) if a is not Ellipsis]
        if origin is None or not args:
            continue
        if mapping and isinstance(origin, type) and issubclass(origin, Mapping):
            items.append(args[-1])
        elif (
            not mapping
            and isinstance(origin, type)
            and issubclass(origin, Sequence)
            and not issubclass(origin, str)
        ):
            items.extend(args)
    return items


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity (taskset, a Slurm allocation), which
    os.cpu_count() ignores."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return cpus or 1


def most_workers() -> int:
    """The most worker processes a loader or a reservoir may start on this machine: four per
    CPU this process may use, and never fewer than 64 (a config written for a larger
    machine stays usable here)."""
    return max(64, 4 * usable_cpus())


def refuse_too_many_workers(value: int) -> int:
    """A field validator (mode "after") of a count of worker processes: beyond
    `most_workers()`, a run would fork until the machine gave out."""
    bound = most_workers()
    if value > bound:
        raise PydanticCustomError(
            "too_many_workers",
            f"{value} worker processes are far more than this machine's CPUs can use: use at "
            f"most {bound} (4 per CPU; a few per CPU is usual)",
        )
    return value
