"""Resolving `${...}` interpolations and `???` markers, reporting every failure at once.

OmegaConf does the resolving (`${training.dataloader.batch_size}`, relative `${..x}`,
`${oc.env:VAR,default}`, any registered resolver). Its own errors name a key but not the file,
so each interpolation is first resolved on its own here: that way every failing key is
reported with its file and line, and the user fixes them all in one pass.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, cast

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from torchloom.errors import ConfigError, Problem, Where, first_line

MISSING_MARKER = "???"


def ascii_digits(text: str) -> bool:
    """Whether `text` is a whole number written in 0-9 (a key segment that indexes a list, a
    port): `str.isdigit` also takes `²`, which `int` refuses, and other scripts' digits."""
    return text.isascii() and text.isdigit()


def dotted(path: tuple[Any, ...]) -> str:
    """'training.layers[2].size' for a key path with list indices as ints."""
    text = ""
    for key in path:
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else str(key))
    return text


def resolve_config(config: DictConfig, where: Where) -> dict[str, Any]:
    """Plain data with every interpolation resolved; a ConfigError lists each failing key."""
    raw = OmegaConf.to_container(config, resolve=False)
    problems: list[Problem] = []
    _check_values(config, raw, (), where, problems)
    if problems:
        raise ConfigError(_with_blocking_values(problems, raw, where))
    try:
        resolved = OmegaConf.to_container(config, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as exc:  # a failure the per-key pass could not see
        raise ConfigError.at("", "interpolation", first_line(exc)) from exc
    return cast(dict[str, Any], resolved)


def _check_values(
    node: DictConfig | ListConfig,
    raw: Any,
    path: tuple[Any, ...],
    where: Where,
    problems: list[Problem],
) -> None:
    # `raw` is the unresolved plain copy of `node`: walking it never triggers resolution,
    # so each interpolation is resolved exactly once, below, inside its own try.
    items: Iterable[tuple[Any, Any]] = raw.items() if isinstance(raw, dict) else enumerate(raw)
    for key, raw_value in items:
        value_path = (*path, key)
        if isinstance(raw_value, dict | list):
            _check_values(node[key], raw_value, value_path, where, problems)
        elif raw_value == MISSING_MARKER and OmegaConf.is_missing(node, key):
            problems.append(
                Problem(
                    where(*value_path),
                    f"key '{dotted(value_path)}'",
                    f"mandatory value missing ('{MISSING_MARKER}')",
                    f"set it in a config file or on the command line: {dotted(value_path)}=VALUE",
                )
            )
        elif isinstance(raw_value, str) and OmegaConf.is_interpolation(node, key):
            try:
                node[key]
            except OmegaConfBaseException as exc:
                problems.append(
                    Problem(
                        where(*value_path),
                        f"key '{dotted(value_path)}'",
                        f"cannot resolve '{raw_value}': {first_line(exc)}",
                    )
                )


_REFERENCE = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")


def _with_blocking_values(problems: list[Problem], raw: Any, where: Where) -> list[Problem]:
    """Put first the value that broke interpolations: `training: 5` in the user's file breaks
    every `${training.task...}` of an included file, and it is the real culprit to name."""
    culprits: dict[tuple[str, ...], Problem] = {}
    for problem in problems:
        for reference in _REFERENCE.findall(problem.message):
            node, parts = raw, reference.split(".")
            for depth, part in enumerate(parts):
                if not isinstance(node, dict):
                    path = tuple(parts[:depth])
                    culprits.setdefault(
                        path,
                        Problem(
                            where(*path),
                            f"key '{dotted(path)}'",
                            f"is {node!r}, but '${{{reference}}}' refers inside it, so it must be "
                            "a mapping",
                        ),
                    )
                    break
                if part not in node:
                    break
                node = node[part]
    return [*culprits.values(), *problems]
