"""How a study searches: sampler, pruner, monitored statistic, trials, time limit.

Each comes from the `search:` section's keys without a dot, and the command line wins:

    search:
      sampler: {type: tpe, n_startup_trials: 5}   # or just `sampler: tpe`
      pruner: hyperband                            # none | median | percentile | sha | hyperband
      monitor: validation.accuracy                 # default: the run's early-stopping monitor
      mode: max
      trials: 20
      timeout: 600                                 # seconds; no new trial starts after it

A sampler's or pruner's other keys are its Optuna constructor's arguments, checked by name.
`evolution` is torchloom's own sampler (regularized evolution, evolution_sampler.py):
`sampler: {type: evolution, population_size: 20, sample_size: 5}`.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torchloom.errors import ConfigError, Problem, did_you_mean
from torchloom.search.space import SearchSpace

SAMPLERS = {
    "tpe": "TPESampler",
    "random": "RandomSampler",
    "grid": "GridSampler",
    "cmaes": "CmaEsSampler",
    "nsga2": "NSGAIISampler",
    "gp": "GPSampler",
    "qmc": "QMCSampler",
    # torchloom's own, as module:class
    "evolution": "torchloom.search.evolution_sampler:RegularizedEvolutionSampler",
}
PRUNERS = {
    "none": "NopPruner",
    "median": "MedianPruner",
    "percentile": "PercentilePruner",
    "sha": "SuccessiveHalvingPruner",
    "hyperband": "HyperbandPruner",
    "threshold": "ThresholdPruner",
}
SETTINGS = ("sampler", "pruner", "monitor", "mode", "trials", "timeout")
# Packages a sampler imports only when it first samples (CmaEsSampler at the second trial):
# looked for when the settings are read, so that a missing one is refused before any trial.
NEEDS = {"cmaes": "cmaes", "qmc": "scipy"}


@dataclass
class SearchSettings:
    sampler: dict[str, Any] = field(default_factory=lambda: {"type": "tpe"})
    pruner: dict[str, Any] = field(default_factory=lambda: {"type": "none"})
    monitor: str | None = None
    mode: str | None = None
    trials: int | None = None
    timeout: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


def read_settings(space: SearchSpace, command_line: Mapping[str, Any]) -> SearchSettings:
    """The section's settings with the command line's (non-None) values over them."""
    problems: list[Problem] = []
    raw = dict(space.settings)
    for key in list(raw):
        if key not in SETTINGS:
            problems.append(
                Problem(
                    space.settings_where[key],
                    f"search setting '{key}'",
                    "unknown setting (search parameters are dotted config keys)",
                    did_you_mean(key, SETTINGS) or f"settings: {', '.join(SETTINGS)}",
                )
            )
            del raw[key]
    given = {k: v for k, v in command_line.items() if v is not None}
    where = {**space.settings_where, **dict.fromkeys(given, "command line")}
    raw.update(given)
    settings = SearchSettings()
    for key, kinds in (("sampler", SAMPLERS), ("pruner", PRUNERS)):
        if key in raw:
            try:
                setattr(settings, key, _component(key, raw[key], kinds, where[key]))
            except ConfigError as error:
                problems += error.problems
    if "mode" in raw:
        if raw["mode"] not in ("min", "max"):
            problems.append(Problem(where["mode"], "search setting 'mode'", "must be min or max"))
        settings.mode = raw["mode"]
    if "monitor" in raw:
        if not isinstance(raw["monitor"], str) or "." not in raw["monitor"]:
            problems.append(
                Problem(
                    where["monitor"],
                    "search setting 'monitor'",
                    f"must name a statistic as section.name, got {raw['monitor']!r}",
                    "e.g. validation.accuracy",
                )
            )
        settings.monitor = raw["monitor"]
    for key in ("trials", "timeout"):
        if key in raw:
            value = raw[key]
            number = isinstance(value, int | float) and not isinstance(value, bool)
            infinite = isinstance(value, float) and not math.isfinite(value)  # .nan, .inf
            if not number or infinite or value <= 0:
                problems.append(
                    Problem(where[key], f"search setting '{key}'", "must be a positive number")
                )
            elif key == "trials" and value != int(value):  # 2.5 ran 2, without a word
                problems.append(
                    Problem(where[key], "search setting 'trials'", f"must be whole, got {value}")
                )
            else:
                setattr(settings, key, int(value) if key == "trials" else float(value))
    if not problems and settings.sampler["type"] == "grid":
        problems += _grid_problems(space, where.get("sampler", space.source))
    if problems:
        raise ConfigError(problems)
    return settings


def component_spec(key: str, raw: Any, where: str) -> dict[str, Any]:
    """The checked {type: name, ...} of a sampler or pruner given as a name or a mapping."""
    return _component(key, raw, SAMPLERS if key == "sampler" else PRUNERS, where)


def _component(key: str, raw: Any, kinds: Mapping[str, str], where: str) -> dict[str, Any]:
    spec = {"type": raw} if isinstance(raw, str) else raw
    if not isinstance(spec, Mapping) or not isinstance(spec.get("type"), str):
        raise ConfigError.at(
            where, f"search setting '{key}'", f"must be a name or {{type: name, ...}}, got {raw!r}"
        )
    spec = dict(spec)
    if spec["type"] not in kinds:
        raise ConfigError.at(
            where,
            f"search setting '{key}'",
            f"unknown {key} '{spec['type']}'",
            did_you_mean(spec["type"], kinds) or f"known: {', '.join(kinds)}",
        )
    package = NEEDS.get(spec["type"]) if key == "sampler" else None
    if package and importlib.util.find_spec(package) is None:
        raise ConfigError.at(
            where,
            f"search setting '{key}'",
            f"the {spec['type']} sampler needs the package {package}, which is not installed",
            f"pip install 'torchloom[search]' (or pip install {package})",
        )
    cls = component_class(key, spec["type"])
    parameters = inspect.signature(cls.__init__).parameters
    accepted = [p for p in parameters if p != "self"]
    for name, value in spec.items():
        if name == "type":
            continue
        if name not in accepted:
            raise ConfigError.at(
                where,
                f"search setting '{key}.{name}'",
                f"is no argument of {cls.__name__}",
                did_you_mean(name, accepted) or f"it takes {', '.join(accepted)}",
            )
        if key == "sampler":
            problem = _argument_problem(name, value, parameters[name].annotation)
            if problem:
                raise ConfigError.at(where, f"search setting '{key}.{name}'", problem)
    # Built once here, so that a missing or wrong argument is refused before the search
    # folder is made: a sampler's own checks otherwise ran in each worker, which failed
    # every trial ("its values could not be drawn") or the first after the folder was made.
    arguments = {name: value for name, value in spec.items() if name != "type"}
    if cls.__name__ == "GridSampler":  # its space comes from the search's (make_sampler)
        arguments.setdefault("search_space", {"a parameter": [0]})
    try:
        with warnings.catch_warnings():  # QMC's and GP's "experimental", said by Optuna
            warnings.simplefilter("ignore")
            cls(**arguments)
    except (ValueError, TypeError) as error:
        raise ConfigError.at(where, f"search setting '{key}'", str(error)) from error
    return spec


# Bounds of the samplers' size-like arguments, each allocated or looped over at every trial:
# TPE's n_ei_candidates of 2,000,000,000 asked 15 GB of each trial. No search needs more.
MAX_SAMPLER_SIZES = {
    "n_ei_candidates": 10_000,  # TPE's candidates drawn per parameter (default 24)
    "population_size": 10_000,  # NSGA-II's generation, the evolution sampler's population
    "sample_size": 10_000,  # the evolution sampler's tournament
    "popsize": 10_000,  # CMA-ES's generation
    "inc_popsize": 16,  # the factor of CMA-ES's generation at each restart
    "n_startup_trials": 1_000_000,  # random trials first: more than any search runs
}
# Lower bounds of numeric arguments that the samplers take on trust (a negative sigma0 was
# accepted, a negative n_startup_trials meant none).
MIN_SAMPLER_VALUES = {"n_ei_candidates": 1, "n_startup_trials": 0, "seed": 0}
POSITIVE_SAMPLER_VALUES = ("sigma0", "prior_weight")
# What a config can give for the type an argument is annotated with (its first word).
CONFIG_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "str": (str,),
    "dict": (Mapping,),
    "Mapping": (Mapping,),
}


def _argument_problem(name: str, value: Any, annotation: Any) -> str:
    """Why a config's `value` cannot be the sampler's argument `name` ('' when it can): its
    type against the constructor's annotation (a string: Optuna's modules postpone them),
    then the bounds above."""
    kinds = [part.strip().split("[")[0] for part in str(annotation).split("|")]
    if value is None and "None" in kinds:
        return ""
    wanted = [kind for kind in kinds if kind in CONFIG_TYPES]
    if not wanted:
        return f"takes a Python object ({annotation}), which a config cannot give"
    fits = [kind for kind in wanted if isinstance(value, CONFIG_TYPES[kind])]
    if not fits or (isinstance(value, bool) and "bool" not in fits):
        return f"must be {' or '.join(wanted)}, got {value!r}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            return f"must be finite, got {value!r}"
        if name in MAX_SAMPLER_SIZES and value > MAX_SAMPLER_SIZES[name]:
            limit = MAX_SAMPLER_SIZES[name]
            return f"must be at most {limit:,} (MAX_SAMPLER_SIZES), got {value!r}"
        if name in MIN_SAMPLER_VALUES and value < MIN_SAMPLER_VALUES[name]:
            return f"must be at least {MIN_SAMPLER_VALUES[name]}, got {value!r}"
        if name == "seed" and value >= 2**32:  # NumPy's seeds
            return f"must be below 2**32, got {value!r}"
        if name in POSITIVE_SAMPLER_VALUES and value <= 0:
            return f"must be above 0, got {value!r}"
    return ""


def component_class(key: str, name: str) -> Any:
    """The class of a sampler or pruner named in a search's settings: Optuna's, or
    torchloom's own (a `module:class` entry of SAMPLERS)."""
    target = (SAMPLERS if key == "sampler" else PRUNERS)[name]
    if ":" in target:
        module, _, attribute = target.partition(":")
        return getattr(importlib.import_module(module), attribute)
    import optuna

    return getattr(optuna.samplers if key == "sampler" else optuna.pruners, target)


def _grid_problems(space: SearchSpace, where: str) -> list[Problem]:
    problems = []
    for parameter in space.parameters.values():
        if parameter.grid_count() is None or parameter.when:
            why = "has a condition" if parameter.when else "is a continuous range"
            problems.append(
                Problem(
                    parameter.where,
                    f"search parameter '{parameter.path}'",
                    f"{why}, which the grid sampler ({where}) cannot enumerate",
                    "use {choice: [...]} or {int: [a, b]} without `when`, or another sampler",
                )
            )
    counts = {path: p.grid_count() or 0 for path, p in space.parameters.items()}
    too_many = grid_points_problem(counts) if not problems else ""
    if too_many:
        problems.append(
            Problem(space.source, "search space", too_many, "search fewer values, or sample")
        )
    return problems


# The most points a grid may have: a search of more would not end, and its sampler lists
# them all in every worker (10^9 points: no trial had started after a minute).
MAX_GRID_POINTS = 1_000_000


def grid_points_problem(counts: Mapping[str, int]) -> str:
    """Why a grid of parameters with these value counts is refused ('' when it is not)."""
    total = math.prod(counts.values())
    if total <= MAX_GRID_POINTS:
        return ""
    largest = max(counts, key=lambda name: counts[name])
    return (
        f"makes a grid of {total:.3g} points, more than the {MAX_GRID_POINTS:,} a search can "
        f"try ('{largest}' alone has {counts[largest]:,} values)"
    )


def grid_size(space: SearchSpace) -> int:
    return math.prod(parameter.grid_count() or 0 for parameter in space.parameters.values())
