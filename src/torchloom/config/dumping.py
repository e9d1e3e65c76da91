"""Writing config data back to YAML that `load_config` reads as the same data."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import yaml

from torchloom.config.yaml_reader import ConfigDumper
from torchloom.errors import ConfigError

# Any run of backslashes followed by `${`: see _escape_interpolation.
_INTERPOLATION_START = re.compile(r"(\\*)\$\{")


def dump_config(data: Mapping[str, Any], interpolations: bool = False) -> str:
    """YAML text (safe_dump rules, keys in their given order) that load_config reads back to
    data equal to `data`.

    Strings that YAML would read as another type (`"1e-3"`, `"true"`) are quoted, and a
    literal `${` is escaped so that it is not taken for an interpolation when read back.
    The one string that cannot be written is `???`: it reads back as a missing value.
    `interpolations`: write `${...}` as is, to be resolved when read (a config written in
    Python, read as its YAML would be).
    """
    return yaml.dump(
        _escaped_plain(data, escape=not interpolations),
        Dumper=ConfigDumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
    )


def plain_config_data(data: Mapping[str, Any], where: str = "config") -> dict[str, Any]:
    """`data` as the plain values a config holds (see _escaped_plain), strings as they are:
    what code hands over (Trainer settings) made what a config read from YAML would be."""
    plain: dict[str, Any] = _escaped_plain(data, escape=False, where=where)
    return plain


def _escaped_plain(
    value: Any, escape: bool = True, path: tuple[Any, ...] = (), where: str = "config"
) -> Any:
    """Plain dicts/lists (tuples and other mappings converted) with strings escaped; a path
    is written as its text and a numpy scalar as its Python number (a config written in
    Python holds them naturally). Anything else is an error naming its key, not a yaml
    RepresenterError."""
    if isinstance(value, Mapping):
        return {k: _escaped_plain(item, escape, (*path, k), where) for k, item in value.items()}
    if isinstance(value, list | tuple):
        return [_escaped_plain(item, escape, (*path, i), where) for i, item in enumerate(value)]
    if type(value).__module__ == "numpy" and getattr(value, "shape", None) == ():
        # np.float64 is a float and np.str_ a str, but yaml's safe dumper takes exact types
        # only. Duck-typed: torchloom.config imports neither numpy nor torch.
        return _escaped_plain(value.item(), escape, path, where)
    if isinstance(value, str):
        text = str.__str__(value)  # a str subclass (a StrEnum) as a plain str
        return _escape_interpolation(text) if escape else text
    if value is None:
        return value
    for plain in (bool, int, float):  # a subclass (an IntEnum) as its plain value
        if isinstance(value, plain):
            return plain(value)
    if isinstance(value, os.PathLike):
        return _escaped_plain(os.fspath(value), escape, path, where)
    raise ConfigError.at(
        where,
        f"key '{'.'.join(str(p) for p in path)}'",
        f"is of type {type(value).__name__}, which a config cannot hold",
        "give a number, string, boolean, null, list or mapping",
    )


def _escape_interpolation(text: str) -> str:
    # OmegaConf reads `\${` as a literal `${`, and `\\` just before `${` as one backslash;
    # doubling the backslashes in front of each `${` and adding one more undoes both.
    return _INTERPOLATION_START.sub(lambda m: m.group(1) * 2 + "\\${", text)


def override_text(key: str, value: Any) -> str:
    """`key=value` as an override that sets `value` (read as YAML: a string "true" quoted)."""
    text = yaml.dump(
        _escaped_plain(value), Dumper=ConfigDumper, default_flow_style=True, width=2**31
    )
    return f"{key}={text.removesuffix(YAML_DOCUMENT_END).strip()}"


def flatten_config(data: Any, prefix: str = "") -> dict[str, Any]:
    """`{"a.b.c": value}` for every leaf of nested mappings (lists and empty mappings are
    leaves), in the data's order."""
    if isinstance(data, Mapping) and data:
        flat: dict[str, Any] = {}
        for key, item in data.items():
            flat.update(flatten_config(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: data} if prefix else {}


MISSING = "(absent)"
# What PyYAML writes after a lone scalar.
YAML_DOCUMENT_END = "...\n"


def config_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) for every leaf that differs; MISSING where a key
    exists on one side only."""
    before, after = flatten_config(old), flatten_config(new)
    keys = [*before, *(key for key in after if key not in before)]
    return [
        (key, before.get(key, MISSING), after.get(key, MISSING))
        for key in keys
        if before.get(key, MISSING) != after.get(key, MISSING)
    ]
