"""Reading a space (the config's `search:` section, or a `--space` file) and checking it
against the config before any trial: every value a trial could get at the ends of its range
(and every choice) goes through the same schema, build and handshake as a trial's config, so
a value a component rejects names the search parameter and its line, not a failed trial;
and the `++path=value` overrides that give a trial its values."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torchloom.config import LoadedConfig
from torchloom.config.loading import ConfigSource
from torchloom.config.origins import display_path
from torchloom.config.yaml_reader import parse_config_text
from torchloom.errors import ConfigError, LoomError, Problem
from torchloom.search.space import SearchSpace, parse_space

SECTION = "search"
# What every trial's config gets on top of the search's values: no search section, and the
# cheap analysis preset made for search runs (history and learning rate only).
TRIAL_OVERRIDES = (f"~{SECTION}", "++analysis=minimal")


SpaceSource = str | os.PathLike[str] | Mapping[str, Any]


def read_space(loaded: LoadedConfig, space_file: SpaceSource | None) -> SearchSpace:
    """The space of `--space FILE` (its top level, or its `search:` mapping) or of a mapping
    (the Python API), else the config's `search:` section; ConfigError when there is neither
    or it is wrong."""
    if isinstance(space_file, Mapping):
        data = space_file.get(SECTION, space_file) if len(space_file) == 1 else space_file

        def located(*keys: Any) -> str:
            return "space mapping" + (f", key {'.'.join(map(str, keys))}" if keys else "")

        return parse_space(data, located, loaded.data)
    if space_file is not None:
        path = Path(space_file).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as error:
            raise ConfigError.at(
                display_path(path), "--space", f"cannot read it: {error.strerror or error}"
            ) from error
        parsed = parse_config_text(text, display_path(path))
        nested = SECTION in parsed.data and len(parsed.data) == 1
        data = parsed.data[SECTION] if nested else parsed.data
        prefix: tuple[str, ...] = (SECTION,) if nested else ()

        def where(*keys: Any) -> str:
            key = (*prefix, *(str(k) for k in keys))
            line = parsed.lines.get(key) or parsed.lines.get(key[:1]) or 1
            return f"{display_path(path)}:{line}"

        return parse_space(data, where, loaded.data)
    if SECTION not in loaded.data:
        raise ConfigError.at(
            loaded.where(),
            "search",
            "the config has no search section and no --space file was given",
            "add `search: {training.optimizer.lr: {loguniform: [1.0e-5, 1.0e-1]}}`",
        )
    return parse_space(
        loaded.data[SECTION], lambda *keys: loaded.where(SECTION, *keys), loaded.data
    )


def trial_overrides(
    loaded: LoadedConfig, values: Mapping[str, Any], base: Sequence[str] = ()
) -> list[str]:
    """A trial's overrides: the command line's, the search's values, then TRIAL_OVERRIDES
    (`~search` only when there is one to delete)."""
    fixed = [o for o in TRIAL_OVERRIDES if o != f"~{SECTION}" or SECTION in loaded.data]
    return [*base, *overrides_for(values), *fixed]


def check_values(
    source: ConfigSource,
    base: Sequence[str],
    loaded: LoadedConfig,
    space: SearchSpace,
) -> None:
    """Every corner value of every parameter, with the values its conditions need, through
    the checks `loom check` makes (`check_trial_config`); one ConfigError
    naming each parameter whose value is refused."""
    problems: list[Problem] = []
    for parameter in space.parameters.values():
        needed = _condition_values(space, parameter.path, loaded.data)
        for value in parameter.corners():
            values = {**needed, parameter.path: value}
            try:
                check_trial_config(source, trial_overrides(loaded, values, base))
            except LoomError as error:
                first = error.problems[0]
                whole = parameter.kind != "int" and "integer" in first.message
                problems.append(
                    Problem(
                        parameter.where,
                        f"search parameter '{parameter.path}'",
                        f"value {value!r} is refused: {first.subject}: {first.message}",
                        f"the key takes whole numbers: search it with int: [{parameter.low}, "
                        f"{parameter.high}]"
                        if whole
                        else first.suggestion,
                    )
                )
                break  # one refused value per parameter says enough
    if problems:
        raise ConfigError(problems)


def _condition_values(space: SearchSpace, path: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """Values of the searched parameters that `path`'s conditions need (recursively)."""
    values: dict[str, Any] = {}
    for other, accepted in space.parameters[path].when:
        if other in space.parameters:
            values.update(_condition_values(space, other, config))
            values[other] = accepted[0]
    return values


def check_trial_config(source: ConfigSource, overrides: Sequence[str]) -> set[str]:
    """What `loom train` checks before it reads data (torchloom.api.check_training), for the
    search's config: returns the statistics the run would have (`validation.accuracy`, ...)."""
    from torchloom.api import check_training

    return check_training(source, overrides)


def overrides_for(values: Mapping[str, Any]) -> list[str]:
    """The `++path=value` overrides that set a trial's values (read back by the config's
    YAML reader: JSON is YAML, and a float keeps its dot so it stays a float)."""
    return [f"++{path}={yaml_value(value)}" for path, value in values.items()]


def yaml_value(value: Any) -> str:
    if isinstance(value, float) and math.isfinite(value):
        text = repr(value)
        if "e" in text and "." not in text.split("e")[0]:
            mantissa, exponent = text.split("e")
            text = f"{mantissa}.0e{exponent}"
        return text
    if isinstance(value, list):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(f"{json.dumps(str(k))}: {yaml_value(v)}" for k, v in value.items())
            + "}"
        )
    return json.dumps(value)
