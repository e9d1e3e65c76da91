"""Command-line overrides in Hydra's grammar, applied to the merged config.

    training.optimizer.lr=0.01        change a key that exists (a typo is an error, not a new key)
    training.seed=7                   ... or set one the section schemas declare (schema.py)
    +pipeline.viewer.type=StreamViewer   add a key that must not exist yet
    ++training.seed=7                 add the key or change it, whichever applies
    ~pipeline.accuracy                delete a key that exists
    ~pipeline.accuracy={type: X}      delete it only if it currently has that value
    pipeline.net.genotype.normal.0.0=max_pool_3x3   an item of a list, by its position

Values are read with the config files' YAML loader, so `1e-3`, `true`, `null`, `[1, 2]` and
`{a: 1}` mean what they mean in a file; an empty value (`key=`) is the empty string, as in
Hydra. As in Hydra, a mapping value assigned to a mapping is merged into it key by key; any
other value replaces the old one whole. A key segment that is a number names the item at
that position of a list, which must exist (an item is changed, never added or deleted: that
would move the others). Every bad override is reported in one ConfigError.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from torchloom.config.interpolation import ascii_digits
from torchloom.config.limits import MAX_DEPTH, limit_problem, value_depth
from torchloom.config.origins import CommandLineOverride, Origins, iter_key_paths
from torchloom.config.yaml_reader import describe_type, parse_yaml_value
from torchloom.errors import ConfigError, Problem, did_you_mean, first_line

INCLUDES_KEY = "default_configs"
WHERE = "command line"


class Action(Enum):
    SET = ""
    ADD = "+"
    ADD_OR_SET = "++"
    DELETE = "~"


@dataclass(frozen=True)
class Override:
    """One parsed override; `value` is None for a plain delete (`has_value` says which)."""

    text: str
    action: Action
    key: tuple[str, ...]
    value: Any
    has_value: bool

    @property
    def dotted_key(self) -> str:
        return ".".join(self.key)


def _problem(text: str, message: str, suggestion: str = "") -> Problem:
    return Problem(WHERE, f"override '{text}'", message, suggestion)


def parse_override(text: str) -> Override:
    """Split `text` into action, key and YAML-parsed value; ConfigError when malformed."""
    for action in (Action.ADD_OR_SET, Action.ADD, Action.DELETE):
        if text.startswith(action.value):
            body = text[len(action.value) :]
            break
    else:
        action, body = Action.SET, text
    key_text, equals, value_text = body.partition("=")
    if not equals and action is not Action.DELETE:
        raise ConfigError([_problem(text, "expected KEY=VALUE", f"for example '{body}=VALUE'")])
    segments = key_text.split(".")
    if not key_text or any(not s or s != s.strip() for s in segments):
        raise ConfigError(
            [_problem(text, f"malformed key '{key_text}': expected dotted names like 'a.b.c'")]
        )
    if any(bracket in key_text for bracket in "[]"):
        raise ConfigError(
            [
                _problem(
                    text,
                    "list indices are not supported in override keys",
                    "name an item by its position as a key: 'a.b.0', or set the whole list",
                )
            ]
        )
    if segments[0] == INCLUDES_KEY:
        raise ConfigError(
            [_problem(text, f"'{INCLUDES_KEY}' cannot be changed by an override", "edit the file")]
        )
    has_value = bool(equals) and (action is not Action.DELETE or value_text != "")
    value: Any = None
    if has_value:
        try:
            # Hydra reads `key=` as the empty string; YAML would read it as null.
            value = parse_yaml_value(value_text) if value_text else ""
        except ValueError as exc:
            raise ConfigError([_problem(text, str(exc))]) from exc
    if len(segments) + value_depth(value) > MAX_DEPTH:
        found = f"override '{text}' nests more than {MAX_DEPTH} levels deep"
        raise ConfigError([limit_problem(WHERE, "max_depth", found)])
    return Override(text, action, tuple(segments), value, has_value)


def apply_overrides(config: DictConfig, texts: Sequence[str], origins: Origins) -> None:
    """Apply each override in order, recording it in `origins`; all failures in one error."""
    problems: list[Problem] = []
    for text in texts:
        try:
            _apply(config, parse_override(text), origins)
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)


def _existing_depth(data: Any, key: tuple[str, ...]) -> tuple[int, Any]:
    """How many leading segments of `key` exist as mapping keys, and the value the walk
    stopped at: the value of `key` itself when all exist, else the last one that did."""
    node = data
    for depth, segment in enumerate(key):
        if isinstance(node, dict) and segment in node:
            node = node[segment]
        elif isinstance(node, list) and ascii_digits(segment) and int(segment) < len(node):
            node = node[int(segment)]
        else:
            return depth, node
    return len(key), node


def _apply(config: DictConfig, override: Override, origins: Origins) -> None:
    # The unresolved plain copy answers "does this key exist" without the pitfalls of
    # DictConfig (`"k" in cfg` is False for a `???` value, and reading resolves `${...}`).
    data = OmegaConf.to_container(config, resolve=False)
    depth, found = _existing_depth(data, override.key)
    exists = depth == len(override.key)
    text, key = override.text, override.dotted_key

    parent = ".".join(override.key[:depth])
    if not exists and isinstance(found, list) and ascii_digits(override.key[depth]):
        raise ConfigError(
            [
                _problem(
                    text,
                    f"'{parent}' is a list of {len(found)} items (positions 0 to "
                    f"{len(found) - 1}), so it has no item {override.key[depth]}",
                    "an override changes an item; set the whole list to add one",
                )
            ]
        )
    if (
        override.action is Action.DELETE
        and exists
        and depth
        and isinstance(_existing_depth(data, override.key[:-1])[1], list)
    ):
        raise ConfigError(
            [
                _problem(
                    text,
                    "an item of a list cannot be deleted (the items after it would move)",
                    f"set the whole list '{parent.rsplit('.', 1)[0]}'",
                )
            ]
        )
    if not exists and not isinstance(found, dict):
        raise ConfigError(
            [
                _problem(
                    text,
                    f"'{parent}' is {describe_type(found)}, not a mapping, so it has "
                    f"no key '{override.key[depth]}'",
                )
            ]
        )
    if override.action is Action.SET and not exists and not _schema_declares(override.key):
        hint = "To add a new key write '+" + text + "'."
        known = [*found, *_schema_fields(override.key[:depth])]
        section_left_out = override.key[depth] in known and _schema_fields(
            override.key[: depth + 1]
        )
        if section_left_out:  # a section of the schemas the config leaves to its default
            section = ".".join(override.key[: depth + 1])
            hint = (
                f"'{section}' is not in the config, so its default applies; to give it keys of "
                f"your own write '+{text}' (they then replace the whole default)"
            )
            known = []
        raise ConfigError([_unknown_key(override, depth, known, hint)])
    if override.action is Action.DELETE and not exists:
        raise ConfigError([_unknown_key(override, depth, list(found), "")])
    if override.action is Action.ADD and exists:
        body = text[1:]
        raise ConfigError(
            [
                _problem(
                    text,
                    f"key '{key}' already exists",
                    f"to change it write '{body}', or '++{body}' to add or change",
                )
            ]
        )

    try:
        if override.action is Action.DELETE:
            _delete(config, override, found)
            return
        # Mapping onto mapping merges (Hydra's rule); anything else replaces the old value.
        merge = (
            isinstance(override.value, dict)
            and isinstance(found, dict)
            and exists
            and not changes_type(found, override.value)
        )
        OmegaConf.update(config, key, override.value, merge=merge, force_add=True)
    except OmegaConfBaseException as exc:
        raise ConfigError([_problem(text, first_line(exc))]) from exc
    _record(origins, override, first_new_depth=len(override.key) if exists else depth + 1)


def _schema_fields(path: tuple[str, ...]) -> list[str]:
    # As in Hydra with a structured config, a key the schema declares can be set without `+`
    # even where no file sets it (and is suggested for a misspelt one). Imported here: the
    # schemas need pydantic, which plain loading does not (`import torchloom.config` stays
    # cheap).
    from torchloom.config.schema import schema_fields

    return schema_fields(path)


def _schema_declares(key: tuple[str, ...]) -> bool:
    """Whether the whole key path is the schemas' (`training.seed`), not only its start
    (`pipeline.viewer.type` names a new component inside the schema's `pipeline`)."""
    return key[-1] in _schema_fields(key[:-1])


def _delete(config: DictConfig, override: Override, current: Any) -> None:
    if override.has_value and current != override.value:
        raise ConfigError(
            [
                _problem(
                    override.text,
                    f"not deleted: '{override.dotted_key}' is {current!r}, not {override.value!r}",
                    f"write '~{override.dotted_key}' to delete it",
                )
            ]
        )
    parent_key = ".".join(override.key[:-1])
    parent = OmegaConf.select(config, parent_key) if parent_key else config
    del parent[override.key[-1]]


def _unknown_key(override: Override, depth: int, known: list[Any], hint: str) -> Problem:
    missing = override.key[depth]
    message = f"unknown override key '{override.dotted_key}'"
    if depth:
        message += f": '{'.'.join(override.key[:depth])}' has no key '{missing}'"
    suggestions = [did_you_mean(missing, (str(k) for k in known)), hint]
    return _problem(override.text, message, " ".join(s for s in suggestions if s))


def _record(origins: Origins, override: Override, first_new_depth: int) -> None:
    """Mark the key, any parents the override created and everything inside its value."""
    origin = CommandLineOverride(override.text)
    for length in range(first_new_depth, len(override.key) + 1):
        origins[override.key[:length]] = origin
    for inner in iter_key_paths(override.value, override.key):
        origins[inner] = origin


def changes_type(old: dict[Any, Any], new: dict[Any, Any]) -> bool:
    """Whether a mapping replaces one of another `type` (merged whole, not key by key): the
    settings of one optimizer, scheduler or component mean nothing to another."""
    return "type" in old and "type" in new and old["type"] != new["type"]
