"""Loading a config file: its `default_configs` includes, overrides, then interpolation.

Merge order. A file's includes are loaded first, depth-first and in list order, then the
file's own content is merged on top. So the including file wins over everything it includes,
and a later `default_configs` entry wins over an earlier one (each entry is merged as the
whole result of loading it, its own includes included). Mappings merge key by key; lists and
scalars -- and a list meeting a mapping -- are replaced whole. A `???` merged onto a value
that is already set leaves that value in place (OmegaConf's rule).

Steps: read + merge every file (OmegaConf does the merging) -> apply command-line overrides
(overrides.py) -> resolve `${...}` interpolations (interpolation.py).

Include paths are relative to the directory of the file that names them; `~` is expanded and
`loom://sub/path.yml` names a config shipped inside the package (see packaged_configs_root).
The same file may be reached twice through different branches (a diamond); a file that
includes itself, directly or not, is an error showing the chain.

Loading is bounded (torchloom.config.limits): a file's size is checked before it is read, the
YAML reader refuses a document that expands past the limits, the files read and their sizes
are added up here (a file counts each time an include reaches it), and interpolation is
bounded before anything is resolved.
"""

from __future__ import annotations

import importlib.resources
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from torchloom.config.dumping import dump_config
from torchloom.config.interpolation import ascii_digits, dotted, resolve_config
from torchloom.config.interpolation_bounds import check_interpolation_bounds
from torchloom.config.limits import MAX_CHARS, MAX_FILE_BYTES, MAX_FILES, MAX_VALUES, limit_problem
from torchloom.config.origins import (
    CommandLineOverride,
    MappingKey,
    Origins,
    describe_origin,
    display_path,
    file_origins,
    overridden,
    prune_origins,
)
from torchloom.config.overrides import INCLUDES_KEY, apply_overrides, changes_type
from torchloom.config.yaml_reader import KeyPath, ParsedYaml, describe_type, parse_config_text
from torchloom.errors import ConfigError, Problem, did_you_mean, first_line

PACKAGED_PREFIX = "loom://"
CONFIG_SUFFIXES = (".yml", ".yaml")
# What OmegaConf can store; anything else a YAML tag can build (sets, dates) is rejected.
SUPPORTED_VALUE_TYPES = (dict, list, str, int, float, bool, bytes, type(None))
SUPPORTED_KEY_TYPES = (str, int, float, bool)


def packaged_configs_root() -> Path:
    """The folder that `loom://` paths are relative to: the configs shipped in the package."""
    return Path(str(importlib.resources.files("torchloom") / "configs"))


@dataclass
class LoadedConfig:
    """A config after merging, overrides and interpolation, plus where each value came from.

    data:      merged, overridden and resolved plain dicts/lists/scalars (no `default_configs`).
    path:      the top-level file (absolute).
    files:     every file read, in merge order (each once; the top file last).
    overrides: the override strings as given.
    origins:   key path -> where it was last set; read it through `where()`.
    unresolved: `data` before interpolation: the `${...}` strings as written (a resumed run
               resolves them again with its overrides: engine/resume.py).
    """

    data: dict[str, Any]
    path: Path
    files: list[Path]
    overrides: list[str]
    origins: Origins = field(default_factory=dict, repr=False, compare=False)
    unresolved: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def where(self, *keys: str | int) -> str:
        """Where the value at that key path was set: 'configs/mnist/lenet5.yml:12' (path
        relative to cwd when under it, else absolute; line 1-based) for the deepest key-path
        prefix that has a recorded location; "command-line override 'a.b=1'" if an override
        set it last; the top file's path if nothing is known. A mapping whose keys overrides
        changed names them: "top.yml:3 (changed by command-line override 'a.b=1')"."""
        return describe_origin(self.origins, keys, self.path, self._overrides)

    @cached_property
    def _overrides(self) -> list[tuple[KeyPath, CommandLineOverride]]:
        return overridden(self.origins)


ConfigSource = str | os.PathLike[str] | Mapping[str, Any]
MAPPING_NAME = "python_pipeline"  # the name of a mapping config that sets none


def load_config(source: ConfigSource, overrides: Sequence[str] = ()) -> LoadedConfig:
    """Read `source` with its includes, apply `overrides`, resolve interpolations. `source`
    is a YAML file, or a mapping (a config written in Python): read as its YAML text would
    be, with the same checks and limits; its `default_configs` are relative to the working
    directory, and messages name its keys instead of lines.

    Raises ConfigError (listing every problem found in the failing step) for user mistakes.
    """
    override_list = [overrides] if isinstance(overrides, str) else list(overrides)
    reader = _IncludeReader()
    if isinstance(source, Mapping):
        top_file = reader.add_mapping(source)
    else:
        top_file = _locate_top_file(source)
    config, origins = reader.load(top_file, chain=())
    apply_overrides(config, override_list, origins)
    raw = OmegaConf.to_container(config, resolve=False)
    origins = prune_origins(origins, raw)

    overridden_keys = overridden(origins)

    def where(*keys: Any) -> str:
        return describe_origin(origins, keys, top_file, overridden_keys)

    check_interpolation_bounds(cast(dict[str, Any], raw), where)
    data = resolve_config(config, where)
    unresolved = cast(dict[str, Any], raw)
    return LoadedConfig(data, top_file, reader.files, override_list, origins, unresolved)


def _resolve_location(text: str, relative_to: Path) -> Path:
    if text.startswith(PACKAGED_PREFIX):
        return (packaged_configs_root() / text[len(PACKAGED_PREFIX) :]).resolve()
    path = Path(text).expanduser()
    return (path if path.is_absolute() else relative_to / path).resolve()


def _locate_top_file(path: str | os.PathLike[str]) -> Path:
    top_file = _resolve_location(os.fspath(path), Path.cwd())
    if not top_file.is_file():
        message, suggestion = _missing_file_hint(top_file)
        raise ConfigError.at(display_path(top_file), "config file", message, suggestion)
    return top_file


def _missing_file_hint(path: Path) -> tuple[str, str]:
    """('file not found' or why not, a did-you-mean among config files beside it)."""
    if path.is_dir():
        return "is a directory, not a config file", ""
    if not path.parent.is_dir():
        return f"file not found (no directory {display_path(path.parent)})", ""
    siblings = [p for p in path.parent.iterdir() if p.suffix in CONFIG_SUFFIXES]
    root = packaged_configs_root().resolve()
    if path.is_relative_to(root):  # suggested as written: a packaged config's loom:// path
        named = [f"{PACKAGED_PREFIX}{p.relative_to(root).as_posix()}" for p in siblings]
        return "file not found", did_you_mean(
            f"{PACKAGED_PREFIX}{path.relative_to(root).as_posix()}", named
        )
    # Compared without the suffix every config shares, which made 'nofile.yml' 'l.yml'.
    near = [p.name for p in siblings if did_you_mean(path.stem, [p.stem])]
    return "file not found", did_you_mean(path.name, near)


class _IncludeReader:
    """Reads each file once and merges includes depth-first; remembers the files it read."""

    def __init__(self) -> None:
        self.files: list[Path] = []
        self._parsed: dict[Path, ParsedYaml] = {}
        self._mappings: dict[Path, str] = {}  # a config given as a mapping -> its label
        # What every load so far added up to: each load merges the whole file again.
        self._reads = self._values = self._chars = 0

    def load(self, file: Path, chain: tuple[Path, ...]) -> tuple[DictConfig, Origins]:
        """`file` merged over its includes, and the origin of every key path in it.
        `chain` is the files whose includes are being loaded, outermost first."""
        parsed = self._read(file)
        self._count(file, parsed)
        chain = (*chain, file)
        merged: DictConfig = OmegaConf.create({})
        origins: Origins = {}
        problems: list[Problem] = []
        for included, line in self._includes(file, parsed, problems):
            if included in chain:
                problems.append(_cycle_problem(chain, included, file, line))
            elif not included.is_file():
                message, suggestion = _missing_file_hint(included)
                where = f"{display_path(file)}:{line}"
                subject = f"{INCLUDES_KEY} entry '{display_path(included)}'"
                problems.append(Problem(where, subject, message, suggestion))
            else:
                try:
                    _merge(merged, origins, *self.load(included, chain))
                except ConfigError as exc:  # keep going: report every broken include at once
                    problems.extend(exc.problems)
        own_content = {k: v for k, v in parsed.data.items() if k != INCLUDES_KEY}
        problems += _unsupported_values(own_content, parsed, file)
        if problems:
            # dict.fromkeys drops repeats: a broken file reached through both arms of a
            # diamond is reported once.
            raise ConfigError(list(dict.fromkeys(problems)))
        try:
            own = OmegaConf.create(own_content)
        except OmegaConfBaseException as exc:  # whatever the check above did not foresee
            raise ConfigError.at(display_path(file), "config", first_line(exc)) from exc
        _merge(merged, origins, own, self._origins(file, parsed))
        if file not in self.files:
            self.files.append(file)
        return merged, origins

    def add_mapping(self, mapping: Mapping[str, Any]) -> Path:
        """A config given as a mapping, read from its YAML text (so every check a file gets
        applies) under a made-up path in the working directory (where includes start)."""
        data = dict(mapping)
        name = data.get("name") if isinstance(data.get("name"), str) else None
        if not name:
            name = MAPPING_NAME
            data = {"name": name, **data}
        label = f"config mapping '{name}'"
        file = Path.cwd() / label
        self._parsed[file] = parse_config_text(dump_config(data, interpolations=True), label)
        self._mappings[file] = label
        return file

    def _origins(self, file: Path, parsed: ParsedYaml) -> Origins:
        label = self._mappings.get(file)
        if label is None:
            return file_origins(file, parsed.lines)
        return {path: MappingKey(label, path) for path in parsed.lines}

    def _read(self, file: Path) -> ParsedYaml:
        if file not in self._parsed:
            self._parsed[file] = parse_config_text(_read_text(file), display_path(file))
        return self._parsed[file]

    def _count(self, file: Path, parsed: ParsedYaml) -> None:
        self._reads += 1
        self._values += parsed.size.values
        self._chars += parsed.size.chars
        where = display_path(file)
        if self._reads > MAX_FILES:
            found = f"more than {MAX_FILES} files read, counting each include of a file"
            raise ConfigError([limit_problem(where, "max_files", found)])
        if self._values > MAX_VALUES:
            found = f"the files read have more than {MAX_VALUES:,} keys and list items together"
            raise ConfigError([limit_problem(where, "max_values", found)])
        if self._chars > MAX_CHARS:
            found = f"the files read have more than {MAX_CHARS:,} characters together"
            raise ConfigError([limit_problem(where, "max_chars", found)])

    def _includes(
        self, file: Path, parsed: ParsedYaml, problems: list[Problem]
    ) -> list[tuple[Path, int]]:
        """The (absolute path, line) of each `default_configs` entry; bad entries go to
        `problems`."""
        entries = parsed.data.get(INCLUDES_KEY)
        if entries is None:
            return []
        key_line = parsed.lines.get((INCLUDES_KEY,), 1)
        if isinstance(entries, str):
            return [(_resolve_location(entries, file.parent), key_line)]
        if not isinstance(entries, list):
            where = f"{display_path(file)}:{key_line}"
            message = f"must be a list of file paths, got {describe_type(entries)}"
            problems.append(Problem(where, INCLUDES_KEY, message, "write [a.yml, b.yml]"))
            return []
        includes = []
        for index, entry in enumerate(entries):
            line = parsed.lines.get((INCLUDES_KEY, str(index)), key_line)
            if isinstance(entry, str) and entry.strip():
                includes.append((_resolve_location(entry, file.parent), line))
            else:
                where = f"{display_path(file)}:{line}"
                message = f"entries must be file paths, got {describe_type(entry)} ({entry!r})"
                problems.append(Problem(where, f"{INCLUDES_KEY}[{index}]", message))
        return includes


def _read_text(file: Path) -> str:
    """The file's text; refused by its size before it is parsed. At most one byte past the
    limit is read, so a file that is huge (or endless) costs nothing."""
    try:
        with file.open("rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            found = f"the file is larger than {MAX_FILE_BYTES:,} bytes"
            raise ConfigError([limit_problem(display_path(file), "max_file_bytes", found)])
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError.at(display_path(file), "config file", f"cannot read it: {exc}") from exc


def _merge(
    base: DictConfig, base_origins: Origins, overlay: DictConfig, overlay_origins: Origins
) -> None:
    """Merge `overlay` into `base` in place (OmegaConf), keeping origins in step."""
    overlay_data = OmegaConf.to_container(overlay, resolve=False)
    base_data = OmegaConf.to_container(base, resolve=False)
    _drop_replaced_values(base, base_data, overlay_data)
    base.merge_with(overlay)
    for path, origin in overlay_origins.items():
        # A `???` does not replace a value that is already set, so neither does its origin.
        if base_origins.get(path) is None or not _is_missing_marker(overlay_data, path):
            base_origins[path] = origin


def _drop_replaced_values(base: Any, base_data: Any, overlay_data: Any) -> None:
    # Deleting the old value first makes the new one replace it whole, as a scalar would:
    # - a list onto a mapping or the reverse (OmegaConf refuses to merge those);
    # - a mapping naming another `type` (a component, optimizer or scheduler): the settings
    #   of the old type mean nothing to the new one (CosineAnnealingLR's T_max in a StepLR).
    for key, new_value in overlay_data.items():
        if not isinstance(base_data, dict) or key not in base_data:
            continue
        old_value = base_data[key]
        if isinstance(old_value, dict) and isinstance(new_value, dict):
            if changes_type(old_value, new_value):
                del base[key]
            else:
                _drop_replaced_values(base[key], old_value, new_value)
        elif isinstance(old_value, dict | list) and isinstance(new_value, dict | list):
            del base[key]  # one is a list, the other a mapping


def _is_missing_marker(data: Any, path: tuple[str, ...]) -> bool:
    for key in path:
        if isinstance(data, dict):
            matches = [k for k in data if str(k) == key]
            if not matches:
                return False
            data = data[matches[0]]
        elif isinstance(data, list) and ascii_digits(key) and int(key) < len(data):
            data = data[int(key)]
        else:
            return False
    return data == "???"


def _cycle_problem(chain: tuple[Path, ...], included: Path, file: Path, line: int) -> Problem:
    cycle = (*chain[chain.index(included) :], included)
    base_dir = cycle[0].parent

    def short(path: Path) -> str:
        try:
            return str(path.relative_to(base_dir))
        except ValueError:
            return display_path(path)

    shown = " -> ".join(short(p) for p in cycle)
    return Problem(
        f"{display_path(file)}:{line}",
        f"{INCLUDES_KEY} entry '{display_path(included)}'",
        f"include cycle: {shown}",
        "remove one of these includes",
    )


def _unsupported_values(data: dict[Any, Any], parsed: ParsedYaml, file: Path) -> list[Problem]:
    """A Problem for every key or value OmegaConf cannot hold or parse, at its line."""
    problems = []
    for path, key, value in _walk(data, ()):
        line = parsed.lines.get(tuple(str(k) for k in path), 1)
        where, subject = f"{display_path(file)}:{line}", f"key '{dotted(path)}'"
        if not isinstance(key, SUPPORTED_KEY_TYPES):
            problems.append(Problem(where, subject, f"unsupported key {describe_type(key)}"))
        elif not isinstance(value, SUPPORTED_VALUE_TYPES):
            message = f"unsupported value: {describe_type(value)}"
            problems.append(Problem(where, subject, message, "quote it to make it a string"))
        elif isinstance(value, str) and "${" in value:
            try:
                OmegaConf.create({"value": value})  # parses the interpolation grammar
            except OmegaConfBaseException as exc:
                message = f"invalid interpolation '{value}': {first_line(exc)}"
                suggestion = "write '\\${' for a literal '${'"
                problems.append(Problem(where, subject, message, suggestion))
    return problems


def _walk(value: Any, path: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], Any, Any]]:
    """(path, key, value) for every entry inside nested dicts and lists."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, child in items:
        child_path = (*path, key)
        yield child_path, key, child
        if isinstance(child, dict | list):
            yield from _walk(child, child_path)
