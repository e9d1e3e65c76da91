"""Loading limits: a config is input, not code, so reading one is bounded in time and memory.

A few hundred bytes of YAML can ask for gigabytes: an alias bomb (`a1: [*a0, *a0, ...]`, the
"billion laughs"), an interpolation that doubles a string at every step
(`x9: "${x8}${x8}"`), nesting deep enough to exhaust Python's stack. Each limit below is
checked on the cheap representation (the file's size, PyYAML's node graph with aliases still
shared, the interpolation graph) before anything is expanded, so a bomb is refused in a
fraction of a second with a `ConfigError` that names the limit.

The values are far above what real configs use (`tests/config/test_config_limits.py` keeps
every shipped config under an eighth of each) and are documented in docs/user-guide.md,
"Loading limits"; a test checks that table against these constants.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchloom.errors import Problem

# One config file, in bytes, checked before it is parsed (pure-Python YAML parses about
# 200 KB a second, so this also bounds the time spent reading one file).
MAX_FILE_BYTES = 256 * 1024
# Files read while loading one config, counting a file each time an include reaches it:
# `default_configs: [a.yml, a.yml]` in every file doubles the work at each level.
MAX_FILES = 100
# Uses of aliases (`*name`, `<<: *name`) in one YAML document.
MAX_ALIASES = 1_000
# Keys and list items, with every alias expanded: in one file, in all files together (each
# time it is included) and in the config after interpolation (`${a}` copies `a`).
MAX_VALUES = 10_000
# Characters of all keys and string values together, counted like MAX_VALUES.
MAX_CHARS = 1_000_000
# The longest key path (`pipeline.model.layers[0].size` is 5 deep), in a file, an override or
# the interpolated config; also how deeply `${...}` may nest inside one string. OmegaConf
# recurses about a dozen frames per level and fails at about 75 levels.
MAX_DEPTH = 50
# Characters of one string built by interpolation (`"${a}/${b}"`).
MAX_STRING_LENGTH = 100_000
# References resolved to build the whole config, counting every step through a chain
# (`${b}` where b is `${a}` takes two): OmegaConf does not cache what it resolved.
MAX_INTERPOLATION_STEPS = 10_000

DOCS = "see 'Loading limits' in docs/user-guide.md"


@dataclass(frozen=True)
class Limit:
    """A loading limit as messages and the documentation name it."""

    name: str
    value: int
    unit: str
    why: str


LIMITS = (
    Limit("max_file_bytes", MAX_FILE_BYTES, "bytes", "checked before a file is parsed"),
    Limit("max_files", MAX_FILES, "file reads", "a file counts each time it is included"),
    Limit("max_aliases", MAX_ALIASES, "aliases", "per file or override value"),
    Limit("max_values", MAX_VALUES, "keys and list items", "aliases and copies expanded"),
    Limit("max_chars", MAX_CHARS, "characters", "of all keys and strings, expanded"),
    Limit("max_depth", MAX_DEPTH, "levels", "keys in the longest key path"),
    Limit("max_string_length", MAX_STRING_LENGTH, "characters", "of one interpolated string"),
    Limit("max_interpolation_steps", MAX_INTERPOLATION_STEPS, "steps", "references resolved"),
)
LIMIT_BY_NAME = {limit.name: limit for limit in LIMITS}


def limit_problem(where: str, name: str, found: str) -> Problem:
    """A Problem naming the limit `name` that was passed: `found` says by what, e.g. 'this
    file uses more than 1,000 aliases'."""
    assert name in LIMIT_BY_NAME, name
    return Problem(where, f"loading limit {name}", found, f"a config is input, not code: {DOCS}")


class LimitExceeded(Exception):
    """Raised inside the YAML composer; the reader turns it into a ConfigError at `line`."""

    def __init__(self, name: str, found: str, line: int) -> None:
        super().__init__(found)
        self.name = name
        self.found = found
        self.line = line  # 1-based


def interpolation_nesting(text: str) -> int:
    """How deeply `${...}`, `[...]` and `{...}` nest in a string that OmegaConf will parse
    (its grammar parser recurses per level). Quotes and escapes are not understood, so this
    can only over-count, which is safe for a limit far above real use."""
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(depth - 1, 0)
    return deepest


def value_depth(value: Any) -> int:
    """Mappings and lists nested in a plain value (a scalar is 0, `{a: [1]}` is 2)."""
    if isinstance(value, dict):
        return 1 + max((value_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((value_depth(v) for v in value), default=0)
    return 0
