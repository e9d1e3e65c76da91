"""A search space: dotted paths into a config, each with a distribution, read from the
config's `search:` section or from a file given with `--space`.

    search:
      sampler: tpe                     # settings: keys without a dot (see settings.py)
      training.optimizer.lr: {loguniform: [1.0e-5, 1.0e-1]}
      training.dataloader.batch_size: {int: [32, 256], step: 32}
      pipeline.classifier.hidden_sizes:
        choice: [[64], [128, 64]]
        when: {pipeline.classifier.type: FeedForwardNetwork}

Parameters are keys with a dot; each names a key of the config (its parent must exist) and
is set on each trial with a `++path=value` override, so a trial's config.yaml says what the
search chose. Everything here is checked against the loaded config before any trial starts,
each problem naming the parameter and its file:line; the values themselves are checked by
the config's own schema and handshake (checking.py). Importing this module never imports
Optuna: `suggest` receives a trial.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchloom.config.interpolation import ascii_digits
from torchloom.config.schema import schema_fields
from torchloom.errors import ConfigError, Problem, Where, did_you_mean

if TYPE_CHECKING:
    import optuna

DISTRIBUTIONS = ("loguniform", "uniform", "int", "choice")
OPTIONS = {"loguniform": {"step"}, "uniform": {"step"}, "int": {"step", "log"}, "choice": set()}
COMMON_OPTIONS = {"when"}


@dataclass(frozen=True)
class Parameter:
    """One searched key. `low`/`high`/`step`/`log` for numbers, `choices` for a choice;
    `when`: the keys and accepted values that must all hold for it to be sampled."""

    path: str
    kind: str
    where: str
    low: float | int = 0
    high: float | int = 0
    step: float | int | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()
    when: tuple[tuple[str, tuple[Any, ...]], ...] = ()

    @property
    def encoded(self) -> bool:
        """Whether choices go to Optuna as JSON text: it takes None/bool/int/float/str only."""
        return any(isinstance(c, list | dict) for c in self.choices)

    @property
    def options(self) -> list[Any]:
        """The choices as Optuna takes them (JSON text when encoded)."""
        return [json.dumps(c) if self.encoded else c for c in self.choices]

    def suggest(self, trial: optuna.trial.BaseTrial) -> Any:
        if self.kind == "choice":
            picked = trial.suggest_categorical(self.path, self.options)
            return json.loads(str(picked)) if self.encoded else picked
        if self.kind == "int":
            return trial.suggest_int(
                self.path, int(self.low), int(self.high), step=int(self.step or 1), log=self.log
            )
        return trial.suggest_float(
            self.path, float(self.low), float(self.high), step=self.step, log=self.log
        )

    def corners(self) -> list[Any]:
        """The values checked before any trial: both ends of a range, every choice; for a
        continuous range also a value inside it with a fraction, which ends that are whole
        numbers do not test (`uniform: [16, 64]` on an integer key passed with 16.0 and
        64.0, and every trial failed on 33.76)."""
        if self.kind == "choice":
            return list(self.choices)
        if self.kind == "int":
            step = int(self.step or 1)
            top = int(self.low) + (int(self.high) - int(self.low)) // step * step
            return list(dict.fromkeys([int(self.low), top]))
        low, high = float(self.low), float(self.high)
        inside = [] if self.step is not None else [low + (high - low) * 0.37]
        return list(dict.fromkeys([low, high, *(v for v in inside if v != int(v))]))

    def grid(self) -> list[Any] | None:
        """Every value a grid sampler tries, or None for a continuous range (see grid_count:
        check the count before a range is made into a list)."""
        values = self._grid_values()
        return None if values is None else list(values)

    def grid_count(self) -> int | None:
        """How many values the grid sampler tries, without making them (an int range of
        10^12 values was a list of them, a MemoryError); None for a continuous range."""
        values = self._grid_values()
        return None if values is None else len(values)

    def _grid_values(self) -> Sequence[Any] | None:
        if self.kind == "choice":
            return self.options
        if self.kind == "int" and not self.log:
            return range(int(self.low), int(self.high) + 1, int(self.step or 1))
        return None

    def describe(self) -> str:
        if self.kind == "choice":
            return f"choice of {len(self.choices)}"
        text = f"{self.kind} [{self.low}, {self.high}]"
        text += f" step {self.step}" if self.step is not None else ""
        return text + (" log" if self.log and self.kind == "int" else "")


@dataclass
class SearchSpace:
    """The parameters in sampling order (a parameter after those its `when` names), the
    settings (keys without a dot, checked by settings.py) and where the space was read."""

    parameters: dict[str, Parameter]
    settings: dict[str, Any] = field(default_factory=dict)
    settings_where: dict[str, str] = field(default_factory=dict)
    source: str = ""

    def sample(self, trial: optuna.trial.BaseTrial, config: Mapping[str, Any]) -> dict[str, Any]:
        """The values of one trial: every parameter whose conditions hold (on values sampled
        before it, or on the config's own values)."""
        values: dict[str, Any] = {}
        for parameter in self.parameters.values():
            if self.active(parameter, values, config):
                values[parameter.path] = parameter.suggest(trial)
        return values

    def active(
        self, parameter: Parameter, values: Mapping[str, Any], config: Mapping[str, Any]
    ) -> bool:
        for path, accepted in parameter.when:
            if path in self.parameters:
                if path not in values:
                    return False  # its condition's parameter was itself not sampled
                current = values[path]
            else:
                current = lookup(config, path)[1]
            if current not in accepted:
                return False
        return True


_MISSING = object()


def lookup(config: Mapping[str, Any], path: str) -> tuple[int, Any]:
    """(how many leading keys of `path` exist in `config`, the value there or _MISSING)."""
    current: Any = config
    parts = path.split(".")
    for depth, part in enumerate(parts):
        if isinstance(current, Mapping) and part in current:
            current = current[part]
        elif isinstance(current, list) and ascii_digits(part) and int(part) < len(current):
            current = current[int(part)]
        else:
            return depth, _MISSING
    return len(parts), current


# ---- reading and checking ------------------------------------------------------------------
def parse_space(section: Any, where: Where, config: Mapping[str, Any]) -> SearchSpace:
    """The space of a `search:` mapping; `where(*keys)` locates a key inside it. Raises one
    ConfigError listing every problem (structure, ranges, paths, conditions)."""
    if not isinstance(section, Mapping) or not section:
        raise ConfigError.at(
            where(), "search", "must be a mapping of dotted config keys to distributions"
        )
    problems: list[Problem] = []
    parameters: dict[str, Parameter] = {}
    settings: dict[str, Any] = {}
    settings_where: dict[str, str] = {}
    for key, spec in section.items():
        key = str(key)
        if "." not in key:
            settings[key], settings_where[key] = spec, where(key)
            continue
        try:
            parameters[key] = parse_parameter(key, spec, where(key))
        except ConfigError as error:
            problems += error.problems
    problems += _path_problems(parameters, config)
    problems += _condition_problems(parameters, config)
    if not parameters and not problems:
        problems.append(
            Problem(
                where(),
                "search",
                "has no parameters",
                "add e.g. `training.optimizer.lr: {loguniform: [1.0e-5, 1.0e-1]}`",
            )
        )
    if problems:
        raise ConfigError(problems)
    return SearchSpace(_in_order(parameters), settings, settings_where, where())


def parse_parameter(path: str, spec: Any, where: str) -> Parameter:
    """One parameter of a space from its spec ({loguniform: [a, b]}, ...), checked; `where`
    is where it was written (a YAML file:line, or a code-first builder's line)."""
    subject = f"search parameter '{path}'"
    if not isinstance(spec, Mapping):
        raise ConfigError.at(
            where, subject, f"must be a mapping such as {{uniform: [0, 1]}}, got {spec!r}"
        )
    kinds = [k for k in spec if k in DISTRIBUTIONS]
    if len(kinds) != 1:
        unknown = [str(k) for k in spec if k not in DISTRIBUTIONS and k not in _all_options()]
        hint = did_you_mean(unknown[0], DISTRIBUTIONS) if unknown else ""
        found = "names no distribution" if not kinds else f"names {len(kinds)} distributions"
        raise ConfigError.at(
            where, subject, f"{found}", hint or f"use one of {', '.join(DISTRIBUTIONS)}"
        )
    kind = kinds[0]
    allowed = OPTIONS[kind] | COMMON_OPTIONS | {kind}
    for key in spec:
        if key not in allowed:
            hint = did_you_mean(str(key), allowed) or f"{kind} takes {', '.join(sorted(allowed))}"
            raise ConfigError.at(where, subject, f"unknown option '{key}'", hint)
    when = _conditions(spec.get("when"), where, subject)
    if kind == "choice":
        choices = spec["choice"]
        if not isinstance(choices, list) or not choices:
            raise ConfigError.at(where, subject, "choice must be a non-empty list of values")
        return Parameter(path, kind, where, choices=tuple(choices), when=when)
    bounds = spec[kind]
    numbers = isinstance(bounds, list) and len(bounds) == 2
    if not numbers or not all(_is_number(b) for b in bounds):
        raise ConfigError.at(where, subject, f"{kind} must be [low, high], got {bounds!r}")
    low, high = bounds
    step, log = spec.get("step"), spec.get("log", kind == "loguniform")
    if kind == "int" and not all(isinstance(b, int) for b in bounds):
        raise ConfigError.at(where, subject, f"int bounds must be integers, got {bounds!r}")
    if low > high:
        raise ConfigError.at(
            where, subject, f"low {low} is greater than high {high}", "write [low, high]"
        )
    if not isinstance(log, bool):
        raise ConfigError.at(where, subject, f"log must be true or false, got {log!r}")
    if log and low <= 0:
        raise ConfigError.at(
            where, subject, f"a log range must be above 0, got low {low}", "use uniform for 0"
        )
    if step is not None:
        if not _is_number(step) or step <= 0 or (kind == "int" and not isinstance(step, int)):
            raise ConfigError.at(where, subject, f"step must be a positive number, got {step!r}")
        if log and (step != 1 or kind != "int"):  # Optuna: a log float takes no step at all
            raise ConfigError.at(where, subject, "step and a log scale cannot be combined")
    return Parameter(path, kind, where, low, high, step, bool(log), when=when)


def _all_options() -> set[str]:
    return set().union(*OPTIONS.values(), COMMON_OPTIONS)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _conditions(raw: Any, where: str, subject: str) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError.at(
            where,
            subject,
            f"when must map dotted keys to values, got {raw!r}",
            "e.g. when: {pipeline.classifier.type: FeedForwardNetwork}",
        )
    return tuple((str(k), tuple(v) if isinstance(v, list) else (v,)) for k, v in raw.items())


def _path_problems(parameters: Mapping[str, Parameter], config: Mapping[str, Any]) -> list[Problem]:
    """A parameter's parent key must exist in the config; its own key must exist, or be one
    the section schemas declare, or belong to a typed mapping, whose builder decides."""
    problems = []
    for parameter in parameters.values():
        parts = parameter.path.split(".")
        depth, value = lookup(config, parameter.path)
        if value is not _MISSING:
            continue
        parent = parts[:depth]
        _, parent_value = lookup(config, ".".join(parent)) if parent else (0, config)
        if depth == len(parts) - 1 and isinstance(parent_value, Mapping):
            # A mapping with a `type` (a component, the optimizer, the scheduler) takes the
            # arguments of that type, checked when it is built (checking.py).
            typed = "type" in parent_value
            if typed or parts[-1] in schema_fields(tuple(parts[:-1])):
                continue
        known = list(parent_value) if isinstance(parent_value, Mapping) else []
        known += schema_fields(tuple(parent)) if isinstance(parent_value, Mapping) else []
        missing = ".".join(parts[: depth + 1])
        problems.append(
            Problem(
                parameter.where,
                f"search parameter '{parameter.path}'",
                f"names no key of the config ('{missing}' does not exist)",
                did_you_mean(parts[depth], [str(k) for k in known]),
            )
        )
    return problems


def _condition_problems(
    parameters: Mapping[str, Parameter], config: Mapping[str, Any]
) -> list[Problem]:
    problems = []
    for parameter in parameters.values():
        for path, accepted in parameter.when:
            subject = f"search parameter '{parameter.path}'"
            if path == parameter.path:
                problems.append(Problem(parameter.where, subject, "its condition names itself"))
            elif path in parameters:
                other = parameters[path]
                possible = other.choices if other.kind == "choice" else None
                if possible is not None and not any(a in possible for a in accepted):
                    problems.append(
                        Problem(
                            parameter.where,
                            subject,
                            f"its condition on '{path}' accepts {list(accepted)!r}, which that "
                            f"parameter never takes (choices {list(possible)!r})",
                        )
                    )
            elif lookup(config, path)[1] is _MISSING:
                problems.append(
                    Problem(
                        parameter.where,
                        subject,
                        f"its condition names '{path}', neither a search parameter nor a key "
                        "of the config",
                        did_you_mean(path, list(parameters)),
                    )
                )
    problems += _cycle_problems(parameters) if not problems else []
    return problems


def _cycle_problems(parameters: Mapping[str, Parameter]) -> list[Problem]:
    problems = []
    for parameter in parameters.values():
        seen, todo = set(), [p for p, _ in parameter.when if p in parameters]
        while todo:
            path = todo.pop()
            if path == parameter.path:
                problems.append(
                    Problem(
                        parameter.where,
                        f"search parameter '{parameter.path}'",
                        "its conditions depend on it again (a cycle)",
                    )
                )
                break
            if path not in seen:
                seen.add(path)
                todo += [p for p, _ in parameters[path].when if p in parameters]
    return problems


def _in_order(parameters: Mapping[str, Parameter]) -> dict[str, Parameter]:
    """Declaration order, moved so that each parameter follows those its conditions name."""
    ordered: dict[str, Parameter] = {}

    def visit(parameter: Parameter) -> None:
        if parameter.path in ordered:
            return
        for path, _ in parameter.when:
            if path in parameters:
                visit(parameters[path])
        ordered[parameter.path] = parameter

    for parameter in parameters.values():
        visit(parameter)
    return ordered
