"""The one exception hierarchy for user errors.

A `LoomError` is the user's to fix (a config, a file, a value): the CLI prints it plainly and
exits with status 2. Anything else that escapes is an internal bug: exit 1 with a traceback.
This module imports nothing heavy so that config, core and the CLI can all depend on it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar, get_args

# Says where a config key was set, for a message: where("training", "seed") -> 'cfg.yml:12'
# (list positions as ints); what a loaded config's `where` and every builder take.
Where = Callable[..., str]


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """A ' did you mean 'x'?' suffix for a misspelt name, or '' when nothing is close."""
    scored = sorted(
        ((difflib.SequenceMatcher(None, word, c).ratio(), c) for c in set(candidates)),
        reverse=True,
    )
    # Only the best match and those nearly as good: 'validation.acuracy' should suggest
    # 'validation.accuracy', not every name that shares the 'validation.' prefix.
    close = [c for r, c in scored if r >= 0.6 and r >= scored[0][0] - 0.05][:3] if scored else []
    if not close:
        return ""
    quoted = " or ".join(f"'{c}'" for c in close)
    return f"did you mean {quoted}?"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config or a pipeline, with enough context to find and fix it.

    where:      the config file (and line, when known) the culprit comes from.
    subject:    what is wrong: a component, a key path, a stream (e.g. "component 'model'").
    message:    what is wrong, expected versus received where that applies.
    suggestion: how to fix it ("did you mean ...?"), or ''.
    """

    where: str
    subject: str
    message: str
    suggestion: str = ""

    def format(self) -> str:
        text = (
            f"{self.where}: {self.subject}: {self.message}"
            if self.where
            else (f"{self.subject}: {self.message}")
        )
        if self.suggestion:
            text += f" ({self.suggestion})"
        return printable(text)


def printable(text: str) -> str:
    """`text` with its control characters but line ends and tabs written as escapes (`\x1b`):
    a config's keys and values reach the terminal in messages, where an escape sequence
    would recolour, clear or retitle it."""
    return "".join(
        c if c in "\n\t" or (c.isprintable() and c != "\x7f") else repr(c)[1:-1] for c in text
    )


def first_line(error: BaseException) -> str:
    """An exception's first line for a one-line message (libraries append details: OmegaConf
    its 'full_key: ...' lines, torch its C++ frames); its type's name when it says nothing."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def shown_briefly(value: Any, limit: int = 60) -> str:
    """A value as a message shows it: its repr, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fields_of(model: Any) -> dict[str, Any]:
    """The fields of the pydantic model in an annotation (`X | None`, `list[X]`), or {}."""
    fields = getattr(model, "model_fields", None)
    if isinstance(fields, dict):
        return fields
    for argument in get_args(model):
        found = _fields_of(argument)
        if found:
            return found
    return {}


def validation_problems(
    error: Any,
    where: Where,
    path: tuple[Any, ...] = (),
    model: Any = None,
    *,
    also_known: Collection[str] = (),
    component: str = "",
    owner: str = "",
    unions: Collection[str] = (),
) -> list[Problem]:
    """Every field error of a pydantic `ValidationError` as a Problem, all at once: the line of
    the key, what is wrong with what was received, and for an unknown key the closest known
    one. The one translator of validation errors (config sections, component parameters,
    analysis settings, Trainer settings); pydantic itself is not imported here.

    path:       the key path of the validated mapping (("training",), a component's path).
    model:      the validated model class, whose fields (and nested models' fields) name the
                keys an unknown key is compared with; `also_known` adds more (reserved keys).
    component:  the problems' subject when the keys are a component's parameters
                ("component 'net' (LeNet5)"), with `owner` the class named in the message;
                by default each key is its own subject.
    unions:     keys holding a tagged union, whose tag pydantic puts in the error's location.
    """
    problems = []
    for item in error.errors():
        raw = [str(part) for part in item["loc"]]
        loc = tuple(p for i, p in enumerate(raw) if not (i and raw[i - 1] in unions))
        name = ".".join(loc)
        subject = component or f"key '{'.'.join((*map(str, path), *loc))}'"
        said = f"parameter '{name}' " if component else ""
        if item["type"] == "extra_forbidden":
            fields = _fields_of(model)
            for part in loc[:-1]:
                field = fields.get(part)
                fields = _fields_of(field.annotation) if field is not None else {}
            known = [*fields, *(also_known if len(loc) == 1 else ())]
            noun = "parameter" if component else "key"
            hint = did_you_mean(loc[-1], known) or (
                f"known {noun}s: {', '.join(known)}" if known else ""
            )
            message = f"unknown parameter '{name}' of {owner}" if component else "unknown key"
            problems.append(Problem(where(*path, *loc), subject, message, hint))
        elif item["type"] == "missing":
            problems.append(Problem(where(*path, *loc[:-1]), subject, f"{said}is required"))
        else:
            got = shown_briefly(item.get("input"))
            text = f"{said.rstrip()}: {item['msg']}" if said else item["msg"]
            problems.append(Problem(where(*path, *loc), subject, f"{text} (got {got})"))
    return problems


_E = TypeVar("_E", bound="LoomError")


class LoomError(Exception):
    """Base of every error the user can fix. The CLI exits 2 on these."""

    headline = "error"

    def __init__(self, problems: list[Problem] | str) -> None:
        if isinstance(problems, str):
            problems = [self._from_a_loader_worker(problems) or Problem("", "error", problems)]
        self.problems: list[Problem] = list(problems)
        super().__init__(self.format())

    @classmethod
    def _from_a_loader_worker(cls, text: str) -> Problem | None:
        """The problem of an error of this class raised in a loader worker, from the text
        torch builds it again from in the run's process ("Caught DataError in DataLoader
        worker process 0.", the worker's traceback, then its message): the message, said
        by that worker, not the traceback (None for any other text)."""
        caught = re.match(r"Caught \w+ in DataLoader worker process (\d+)\.\n", text)
        said = f"{cls.__module__}.{cls.__qualname__}: {cls.headline}: "
        if caught is None or said not in text:
            return None
        message = text.rsplit(said, 1)[1].rstrip("\n")
        return Problem("", f"loader worker {caught.group(1)}", message)

    @classmethod
    def at(cls: type[_E], where: str, subject: str, message: str, suggestion: str = "") -> _E:
        """The error of one problem, in one statement:
        `raise ConfigError.at(where("training", "seed"), "training.seed", "must be >= 0")`."""
        return cls([Problem(where, subject, message, suggestion)])

    def format(self) -> str:
        if len(self.problems) == 1:
            return f"{self.headline}: {self.problems[0].format()}"
        lines = [f"{self.headline}: {len(self.problems)} problems"]
        lines += [f"  {i}. {p.format()}" for i, p in enumerate(self.problems, 1)]
        return "\n".join(lines)


class ConfigError(LoomError):
    """The YAML, its nesting, an override or a section key is wrong."""

    headline = "config error"


class ComponentError(LoomError):
    """A component cannot be found or built from its config (type, parameters, globals)."""

    headline = "pipeline error"


class HandshakeError(LoomError):
    """Streams, shapes, dtypes or globals of the pipeline graph do not fit together."""

    headline = "handshake failed"


class DataError(LoomError):
    """A data source is missing, malformed, or fails its checksum."""

    headline = "data error"


class WeightsError(LoomError):
    """Pretrained weights named by `load:` cannot be read or do not fit the model."""

    headline = "weights error"


class StorageError(LoomError):
    """A run's files cannot be written or read back: disk full, a read-only folder, a
    damaged checkpoint."""

    headline = "storage error"

    @classmethod
    def from_os(cls, path: object, error: OSError, doing: str = "cannot write it") -> StorageError:
        """The error for an OSError on `path`: the path, what failed and the OS's reason."""
        reason = error.strerror or str(error)
        return cls([Problem("", f"'{path}'", f"{doing}: {reason}")])


class DeployError(LoomError):
    """A run folder cannot be quantized, exported or predicted with as asked (no checkpoint, a
    wrong mode or backend, a component the exported graph cannot hold, an unreadable input)."""

    headline = "deploy error"
