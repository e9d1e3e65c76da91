"""Where each value of a loaded config was set: a file and line, or a command-line override.

The loader keeps one `Origin` per key path, overwritten in merge order so that the entry for a
path always names whoever set it last. Paths whose value was later replaced or deleted are
pruned at the end, so a lookup never points at a line whose value did not survive.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchloom.config.yaml_reader import KeyPath


def display_path(path: Path) -> str:
    """`path` relative to the working directory when it lies under it, else absolute."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


@dataclass(frozen=True)
class FileLine:
    """A key set in a config file, at a 1-based line."""

    file: Path
    line: int

    def describe(self) -> str:
        return f"{display_path(self.file)}:{self.line}"


@dataclass(frozen=True)
class CommandLineOverride:
    """A key set (or added) by an override such as `training.optimizer.lr=0.01`."""

    text: str

    def describe(self) -> str:
        return f"command-line override '{self.text}'"


@dataclass(frozen=True)
class MappingKey:
    """A key of a config given as a Python mapping (`torchloom.train({...})`): no file, no
    line; the key path says where."""

    label: str
    path: KeyPath

    def describe(self) -> str:
        return f"{self.label}, key {'.'.join(self.path)}" if self.path else self.label


Origin = FileLine | CommandLineOverride | MappingKey
Origins = dict[KeyPath, Origin]


def key_path(keys: Iterable[Any]) -> KeyPath:
    """The normalised form used as an `Origins` key (indices and non-string keys as strings)."""
    return tuple(str(key) for key in keys)


def overridden(origins: Origins) -> list[tuple[KeyPath, CommandLineOverride]]:
    """The key paths command-line overrides set (few: those of one command line)."""
    return [(path, o) for path, o in origins.items() if isinstance(o, CommandLineOverride)]


def describe_origin(
    origins: Origins,
    keys: Iterable[Any],
    fallback: Path,
    overrides: Iterable[tuple[KeyPath, CommandLineOverride]] = (),
) -> str:
    """Where the deepest recorded prefix of `keys` was set; `fallback` when none is known.
    A mapping set in a file whose keys an override changed (`overrides`: `overridden`) names
    them too: a check across the mapping's keys fails at the mapping, and the override may
    be the cause."""
    path = key_path(keys)
    origin = next(
        (o for n in range(len(path), 0, -1) if (o := origins.get(path[:n])) is not None), None
    )
    text = display_path(fallback) if origin is None else origin.describe()
    if not path or isinstance(origin, CommandLineOverride):
        return text
    below = [o.describe() for p, o in overrides if len(p) > len(path) and p[: len(path)] == path]
    return f"{text} (changed by {', '.join(dict.fromkeys(below))})" if below else text


def file_origins(file: Path, lines: Mapping[KeyPath, int]) -> Origins:
    return {path: FileLine(file, line) for path, line in lines.items()}


def iter_key_paths(value: Any, prefix: KeyPath = ()) -> Iterator[KeyPath]:
    """Every key path inside a plain dict/list value, parents before children."""
    if isinstance(value, dict):
        items: Iterable[tuple[Any, Any]] = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return
    for key, child in items:
        path = (*prefix, str(key))
        yield path
        yield from iter_key_paths(child, path)


def prune_origins(origins: Origins, final_data: Any) -> Origins:
    """Only the entries whose key path still exists in `final_data` (unresolved plain data)."""
    alive = set(iter_key_paths(final_data))
    return {path: origin for path, origin in origins.items() if path in alive}
