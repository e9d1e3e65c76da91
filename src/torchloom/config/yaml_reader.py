"""Reading YAML config text safely, remembering the line of every key.

`ConfigLoader` is a `yaml.SafeLoader` (safe constructors only; nothing is ever executed) that
differs from PyYAML's YAML 1.1 defaults in four ways:

* `1e-3`, `1E5` and `.5e-3` are floats. YAML 1.1 demands a dot and a signed exponent, so
  PyYAML reads `lr: 1e-3` as the *string* "1e-3" -- a classic silent config bug. OmegaConf's
  own loader works around it the same way: by swapping in a wider float resolver.
* Integers and booleans are YAML 1.2's: `064` is 64 (not octal 52), `1:40` a string (not 100
  in base 60), and `yes`/`no`/`on`/`off` words (`languages: [en, de, no]`), not booleans.
* Dates such as `2024-01-31` stay strings: OmegaConf cannot hold `datetime.date` values.
* A key written twice in one mapping is an error instead of the last one silently winning.

It also counts while it composes PyYAML's node graph, where an alias is still one shared
node: aliases, keys and list items and characters with every alias expanded, and nesting
depth. A document that passes a loading limit (torchloom.config.limits) is refused before a
single Python object is constructed, so an alias bomb costs microseconds, not gigabytes.

Every problem becomes a `ConfigError` that names the file and the 1-based line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml
import yaml.constructor
from yaml.events import AliasEvent, MappingStartEvent, SequenceStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from torchloom.config.limits import (
    MAX_ALIASES,
    MAX_CHARS,
    MAX_DEPTH,
    MAX_VALUES,
    LimitExceeded,
    interpolation_nesting,
    limit_problem,
)
from torchloom.errors import ConfigError, Problem

FLOAT_TAG = "tag:yaml.org,2002:float"
TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
INT_TAG = "tag:yaml.org,2002:int"
BOOL_TAG = "tag:yaml.org,2002:bool"
MERGE_TAG = "tag:yaml.org,2002:merge"

# YAML 1.1 floats plus the forms YAML 1.2 and Python accept: an exponent without a dot
# (`1e-3`) and an exponent without a sign (`1.0e3`).
FLOAT_PATTERN = re.compile(
    r"""^(?:
        [-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?    # 1.0  1.  1.0e-3  1_000.5
      | [-+]?[0-9][0-9_]*[eE][-+]?[0-9]+                  # 1e-3  1E5
      | [-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?           # .5  .5e-3
      | [-+]?\.(?:inf|Inf|INF)
      | \.(?:nan|NaN|NAN)
    )$""",
    re.VERBOSE,
)

# YAML 1.2's integers and booleans, not PyYAML's YAML 1.1 ones, which read `064` as octal 52,
# `1:40` as 100 in base 60, and yes/no/on/off as booleans (a language code `no`, a value
# `on`): decimal (leading zeros and `_` allowed), 0o octal and 0x hexadecimal; true/false.
INT_PATTERN = re.compile(r"^(?:[-+]?[0-9][0-9_]*|0o[0-7_]+|0x[0-9a-fA-F_]+)$")
BOOL_PATTERN = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")

# A key path inside a config: mapping keys and list indices, each turned into a string so
# that `where("layers", 0)` and `where("layers", "0")` find the same entry.
KeyPath = tuple[str, ...]


def _config_implicit_resolvers() -> dict[Any, list[tuple[str, re.Pattern[str]]]]:
    """PyYAML's safe resolver table with the float rule widened, YAML 1.2's integers and
    booleans, and timestamps removed."""
    replaced = (FLOAT_TAG, TIMESTAMP_TAG, INT_TAG, BOOL_TAG)
    table: dict[Any, list[tuple[str, re.Pattern[str]]]] = {}
    for first_char, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items():
        kept = [(tag, rx) for tag, rx in resolvers if tag not in replaced]
        if kept:
            table[first_char] = kept
    for first_char in "tTfF":
        table.setdefault(first_char, []).append((BOOL_TAG, BOOL_PATTERN))
    for first_char in "-+0123456789":
        table.setdefault(first_char, []).append((INT_TAG, INT_PATTERN))
    for first_char in "-+0123456789.":
        table.setdefault(first_char, []).append((FLOAT_TAG, FLOAT_PATTERN))
    return table


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """An integer as YAML 1.2 reads it (`064` is 64); one longer than Python converts (4,300
    digits) is an error at its line, not a ValueError."""
    text = str(loader.construct_scalar(node)).replace("_", "")
    sign = -1 if text.startswith("-") else 1
    digits = text.lstrip("+-")
    base = {"0x": 16, "0o": 8}.get(digits[:2], 10)
    try:
        return sign * int(digits[2:] if base != 10 else digits, base)
    except ValueError as error:
        raise yaml.constructor.ConstructorError(
            None, None, f"cannot read this integer: {str(error).splitlines()[0]}", node.start_mark
        ) from error


CONFIG_IMPLICIT_RESOLVERS = _config_implicit_resolvers()


class ConfigLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 floats, integers and booleans, dates as strings and duplicate
    keys collected as errors.

    `source` is the name that error messages show for the text being read.
    """

    # Assigned in the class body so that PyYAML's class-level table is never mutated.
    yaml_implicit_resolvers = CONFIG_IMPLICIT_RESOLVERS

    def __init__(self, text: str, source: str) -> None:
        super().__init__(text)
        self.source = source
        self.problems: list[Problem] = []
        self.size = DocumentSize()
        self._open_collections = 0  # mappings and lists being composed around this node
        self._deepest = 0  # the most open collections seen inside the node being composed
        # (keys and list items, characters, depth) inside each anchored node, aliases
        # expanded: what one more alias to it adds. Only anchored nodes can be aliased.
        self._anchored: dict[int, tuple[int, int, int]] = {}

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        # A key of a mapping and an item of a list are the "values" MAX_VALUES counts; the
        # value of a key is counted with its key.
        counted = (index is None and isinstance(parent, MappingNode)) or isinstance(
            parent, SequenceNode
        )
        if self.check_event(AliasEvent):
            line = self.peek_event().start_mark.line + 1
            self.size.aliases += 1
            if self.size.aliases > MAX_ALIASES:
                raise LimitExceeded("max_aliases", f"uses more than {MAX_ALIASES:,} aliases", line)
            node = super().compose_node(parent, index)
            # A node still being composed (a recursive alias) has no size yet: the key-line
            # walk reports it as an error later.
            values, chars, depth = self._anchored.get(id(node), (0, 0, 0))
            self._grow(int(counted) + values, chars, self._open_collections + depth, line)
            return node
        event = self.peek_event()
        line = event.start_mark.line + 1
        is_collection = isinstance(event, MappingStartEvent | SequenceStartEvent)
        own_depth = self._open_collections + int(is_collection)
        self._grow(int(counted), 0, own_depth, line)
        start_values, start_chars = self.size.values, self.size.chars
        outer_deepest, self._deepest = self._deepest, own_depth
        self._open_collections += int(is_collection)
        node = super().compose_node(parent, index)
        self._open_collections -= int(is_collection)
        if isinstance(node, ScalarNode):
            self._grow(0, len(node.value), 0, line)
            if "${" in node.value and interpolation_nesting(node.value) > MAX_DEPTH:
                found = f"nests '${{...}}' more than {MAX_DEPTH} levels deep in one string"
                raise LimitExceeded("max_depth", found, line)
        if event.anchor is not None:
            inner_depth = self._deepest - self._open_collections
            self._anchored[id(node)] = (
                self.size.values - start_values,
                self.size.chars - start_chars,
                inner_depth,
            )
        self._deepest = max(outer_deepest, self._deepest)
        return node

    def _grow(self, values: int, chars: int, depth: int, line: int) -> None:
        """Add to the document's expanded size; refuse it as soon as it passes a limit."""
        size = self.size
        size.values += values
        size.chars += chars
        self._deepest = max(self._deepest, depth)
        size.depth = max(size.depth, depth)
        if size.depth > MAX_DEPTH:
            found = f"nests mappings and lists more than {MAX_DEPTH} levels deep"
            raise LimitExceeded("max_depth", found, line)
        if size.values > MAX_VALUES:
            found = f"has more than {MAX_VALUES:,} keys and list items, aliases expanded"
            raise LimitExceeded("max_values", found, line)
        if size.chars > MAX_CHARS:
            found = f"has more than {MAX_CHARS:,} characters, aliases expanded"
            raise LimitExceeded("max_chars", found, line)

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        self._collect_duplicate_keys(node)
        return super().construct_mapping(node, deep=deep)

    def _collect_duplicate_keys(self, node: MappingNode) -> None:
        # Checked before SafeConstructor flattens `<<:` merge keys into the node: a key that
        # overrides one brought in by `<<: *anchor` is intended, not a duplicate.
        first_lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue  # SafeConstructor reports unhashable keys itself
            line = key_node.start_mark.line + 1
            if key in first_lines:
                self.problems.append(
                    Problem(
                        f"{self.source}:{line}",
                        f"key '{key}'",
                        f"duplicate key: it is already set on line {first_lines[key]}",
                        "keep only one of them",
                    )
                )
            else:
                first_lines[key] = line


ConfigLoader.add_constructor(INT_TAG, _construct_int)


class ConfigDumper(yaml.SafeDumper):
    """SafeDumper that quotes exactly the strings `ConfigLoader` would read as something else.

    The dumper decides whether a string needs quotes by asking its resolver; sharing the
    loader's table means `"1e-3"` (a string) is written quoted and reads back as a string.
    """

    yaml_implicit_resolvers = CONFIG_IMPLICIT_RESOLVERS


@dataclass
class DocumentSize:
    """What a YAML document expands to, aliases followed (see torchloom.config.limits)."""

    values: int = 0  # keys and list items
    chars: int = 0  # characters of keys and scalar values
    depth: int = 0  # the longest key path
    aliases: int = 0  # uses of `*name`


@dataclass
class ParsedYaml:
    """A config file's top-level mapping, the 1-based line where each key path is set, and
    the document's expanded size."""

    data: dict[Any, Any]
    lines: dict[KeyPath, int] = field(default_factory=dict)
    size: DocumentSize = field(default_factory=DocumentSize)


def parse_config_text(text: str, source: str) -> ParsedYaml:
    """Parse one config document; its top level must be a mapping (empty text is `{}`).

    `source` is how messages name the text, usually the file path shown to the user.
    """
    loader = ConfigLoader(text, source)
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
        lines: dict[KeyPath, int] = {}
        if root is not None:
            _record_key_lines(loader, root, (), lines, active=set())
    except LimitExceeded as exc:
        found = f"this file {exc.found}"
        raise ConfigError([limit_problem(f"{source}:{exc.line}", exc.name, found)]) from None
    except yaml.MarkedYAMLError as exc:
        raise ConfigError([syntax_problem(exc, source)]) from exc
    except yaml.YAMLError as exc:
        raise ConfigError.at(source, "YAML", f"cannot read the file: {exc}") from exc
    finally:
        loader.dispose()
    if loader.problems:
        raise ConfigError(loader.problems)
    if data is None:
        return ParsedYaml({}, size=loader.size)
    if not isinstance(data, dict):
        raise ConfigError.at(
            f"{source}:{root.start_mark.line + 1 if root is not None else 1}",
            "top level",
            f"a config must be a mapping of keys to values, got {describe_type(data)}",
            "write 'key: value' lines at the top level",
        )
    return ParsedYaml(data, lines, loader.size)


def parse_yaml_value(text: str) -> Any:
    """The value that `text` means in a config file (`0.01`, `1e-3`, `[1, 2]`, `{a: 1}`, ...).

    Raises ValueError with the parser's explanation when `text` is not valid YAML.
    """
    loader = ConfigLoader(text, "value")
    try:
        root = loader.get_single_node()
        value = loader.construct_document(root) if root is not None else None
    except LimitExceeded as exc:
        limit = limit_problem("", exc.name, f"the value {exc.found}")
        raise ValueError(f"{limit.subject}: {limit.message} ({limit.suggestion})") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        column = f" at column {mark.column + 1}" if mark is not None else ""
        raise ValueError(f"invalid YAML value{column}: {exc.problem or exc.context}") from exc
    except yaml.YAMLError as exc:
        raise ValueError(f"invalid YAML value: {exc}") from exc
    finally:
        loader.dispose()
    if loader.problems:
        raise ValueError("; ".join(p.message for p in loader.problems))
    return value


def syntax_problem(exc: yaml.MarkedYAMLError, source: str) -> Problem:
    """A Problem at `source:line:column` (1-based) carrying the parser's own explanation."""
    mark = exc.problem_mark or exc.context_mark
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
    message = exc.problem or "invalid YAML"
    if exc.context and exc.context_mark is not None and exc.context_mark is not mark:
        start = exc.context_mark
        message += f" ({exc.context} at line {start.line + 1}, column {start.column + 1})"
    # A constructor error is well-formed YAML that asks for something a config cannot hold,
    # such as a `!!python/...` tag; calling it a syntax error would send the user astray.
    is_constructor_error = isinstance(exc, yaml.constructor.ConstructorError)
    hint = "indent with spaces: YAML does not allow tabs" if "'\\t'" in message else ""
    return Problem(
        where, "YAML value" if is_constructor_error else "YAML syntax error", message, hint
    )


def describe_type(value: Any) -> str:
    """'a list', 'a string', ... for messages about a value of the wrong kind."""
    names = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}
    names.update({int: "an integer", float: "a number", type(None): "null"})
    return names.get(type(value), f"a value of type {type(value).__name__}")


def _record_key_lines(
    loader: ConfigLoader, node: Node, path: KeyPath, lines: dict[KeyPath, int], active: set[int]
) -> None:
    # `active` holds the nodes on the current path: a recursive alias (`a: &x [*x]`) builds a
    # value that contains itself, which no config can hold and no walk would finish.
    if id(node) in active:
        where = f"{loader.source}:{node.start_mark.line + 1}"
        subject = f"key '{'.'.join(path)}'"
        loader.problems.append(Problem(where, subject, "an alias refers to a value containing it"))
        return
    active.add(id(node))
    if isinstance(node, MappingNode):
        # After construction the node holds `<<:` merged entries first and its own after
        # them, so a later own key correctly overwrites the merged key's line.
        for key_node, value_node in node.value:
            key_path = (*path, str(loader.construct_object(key_node, deep=True)))
            lines[key_path] = key_node.start_mark.line + 1
            _record_key_lines(loader, value_node, key_path, lines, active)
    elif isinstance(node, SequenceNode):
        for index, item_node in enumerate(node.value):
            item_path = (*path, str(index))
            lines[item_path] = item_node.start_mark.line + 1
            _record_key_lines(loader, item_node, item_path, lines, active)
    active.discard(id(node))
