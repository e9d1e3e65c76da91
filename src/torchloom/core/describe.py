"""Documentation of a component, generated from its code: the docstring, the pydantic
parameter schema, the stream specs and the globals. `loom components NAME` prints it and the
reference in docs/ is generated from it, so docs and code cannot drift apart.
"""

from __future__ import annotations

import inspect
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from torchloom.core.component import Component
from torchloom.core.streams import StreamSpec


def first_line(cls: type[Component]) -> str:
    doc = inspect.getdoc(cls) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def _type_text(annotation: Any) -> str:
    """A type as a user reads it: `int | None`, `list[ConvLayer]`, `'relu' | 'tanh'`."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _type_text(args[0])
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (Union, UnionType):
        return " | ".join(_type_text(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_text(a) for a in args)}]" if args else name
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def parameter_rows(cls: type[Component]) -> list[tuple[str, str, str, str]]:
    """(name, type, default, description) for every parameter."""
    return field_rows(cls.Params)


def field_rows(model: type[BaseModel]) -> list[tuple[str, str, str, str]]:
    """(name, type, default, description) for every field of a settings schema (a
    component's parameters, an item of the `analysis:` section)."""
    rows = []
    for name, field in model.model_fields.items():
        if field.default is PydanticUndefined and field.default_factory is None:
            default = "required"
        elif field.default_factory is not None:
            default = repr(_plain(field.default_factory()))  # type: ignore[call-arg]
        else:
            default = repr(field.default)
        rows.append((name, _type_text(field.annotation), default, field.description or ""))
    return rows


def example_instance(cls: type[Component]) -> Component | None:
    """An instance built with default params and the class's EXAMPLE_GLOBALS, to show its
    streams; None when the defaults alone cannot build one."""
    try:
        return cls.create(globals=dict(cls.EXAMPLE_GLOBALS))
    except Exception:  # a documentation aid only: streams are then described as unavailable
        return None


def _spec_lines(specs: dict[str, StreamSpec]) -> list[str]:
    return [f"  {key}: {spec} — {spec.description}" for key, spec in specs.items()] or ["  none"]


def _plain(value: Any) -> Any:
    """A default as YAML can write it: pydantic models (e.g. ConvNetEncoder's layers) become
    mappings."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def yaml_snippet(cls: type[Component], name: str) -> str:
    body: dict[str, Any] = {"type": name}
    for param, field in cls.Params.model_fields.items():
        required = field.default is PydanticUndefined and field.default_factory is None
        if required:
            body[param] = "???"
        elif field.default_factory is not None:
            body[param] = _plain(field.default_factory())  # type: ignore[call-arg]
        else:
            body[param] = _plain(field.default)
    key = f"my_{cls.__name__.lower()}"  # also for a `package.module:Class` type
    text = yaml.safe_dump({key: body}, sort_keys=False, default_flow_style=None).rstrip()
    if cls.NEEDS_GLOBALS:  # a pasted entry fails the handshake when the names differ
        needs = list(cls.NEEDS_GLOBALS)
        text = (
            f"# reads the globals {', '.join(needs)}: published under these names by another "
            f"component, or mapped in the entry: globals: {{{needs[-1]}: NAME_PUBLISHED}}\n" + text
        )
    return text


def describe_component(cls: type[Component], name: str) -> str:
    lines = [f"{name} ({cls.family})", ""]
    lines += [inspect.getdoc(cls) or "(no description)", "", "parameters:"]
    rows = parameter_rows(cls)
    lines += [f"  {n} ({t}, default {d}): {desc}" for n, t, d, desc in rows] or ["  none"]
    instance = example_instance(cls)
    if instance is None:
        lines += [
            "",
            "streams: shown once an example can be built (they depend on required "
            "parameters or on globals without EXAMPLE_GLOBALS)",
        ]
    else:
        example = ", ".join(f"{k}={v!r}" for k, v in cls.EXAMPLE_GLOBALS.items())
        suffix = f" (shown with example globals {example})" if example else ""
        lines += ["", f"input streams{suffix}:", *_spec_lines(instance.input_specs())]
        lines += ["output streams:", *_spec_lines(instance.output_specs())]
    defaults = (
        cls.Params()
        if instance is None and _all_defaulted(cls)
        else (instance.params if instance is not None else None)
    )
    needs = cls.needed_globals(defaults) if defaults is not None else cls.NEEDS_GLOBALS
    publishes = cls.published_globals(defaults) if defaults is not None else cls.PUBLISHES_GLOBALS
    lines += ["", "globals needed:"] + ([f"  {k}: {v}" for k, v in needs.items()] or ["  none"])
    lines += ["globals published:"] + ([f"  {k}: {v}" for k, v in publishes.items()] or ["  none"])
    lines += ["", "config snippet (pipeline entry):", yaml_snippet(cls, name)]
    return "\n".join(lines)


def _all_defaulted(cls: type[Component]) -> bool:
    return all(
        not (f.default is PydanticUndefined and f.default_factory is None)
        for f in cls.Params.model_fields.values()
    )
