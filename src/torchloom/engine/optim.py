"""Optimizer and scheduler from config: any torch.optim / lr_scheduler class by name.

Keyword arguments are checked against the class's signature before it is called, so a
misspelt `lr` is a config error with a suggestion; a string where the default is a number or
a boolean (`lr=abc`) is refused before torch compares it. When torch refuses a value
(`lr=-0.1`), each argument is tried alone on a throwaway parameter to find the culprit, so
the message names the line or command-line override that set it, not the whole section.
`param_groups` gives components their own settings (e.g. a smaller learning rate for a
pretrained encoder); torch checks only the constructor's arguments, so each group's settings
are tried the same way.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from torchloom.config.interpolation import dotted
from torchloom.core.pipeline import Pipeline
from torchloom.errors import ConfigError, Problem, Where, did_you_mean

Key = tuple[str | int, ...]  # a key path in the config, list positions as ints


def _lookup(module: Any, base: type, name: str, key: Key, where: Where) -> type:
    candidates = [
        n
        for n, v in vars(module).items()
        if inspect.isclass(v) and issubclass(v, base) and not n.startswith("_")
    ]
    cls = getattr(module, name, None)
    if not (inspect.isclass(cls) and issubclass(cls, base)):
        raise ConfigError.at(
            where(*key),
            f"{dotted(key)} '{name}'",
            f"is not a {module.__name__} class",
            did_you_mean(name, candidates),
        )
    return cls


# What torch.optim's own checks demand of the arguments they check, said when one fails.
EXPECTED = {
    "lr": "a number >= 0",
    "eps": "a number >= 0",
    "weight_decay": "a number >= 0",
    "momentum": "a number >= 0",
    "alpha": "a number >= 0",
    "betas": "two numbers, each in [0, 1)",
}


def _parameters(cls: type, skip: int) -> dict[str, inspect.Parameter]:
    return {p.name: p for p in list(inspect.signature(cls).parameters.values())[skip:]}


def _wants_number(parameter: inspect.Parameter) -> bool:
    """A number's parameter, by its default or, without one, its annotation (StepLR's
    `step_size: int`: `step_size: true` was a step of 1)."""
    default = parameter.default
    if default is not inspect.Parameter.empty:
        return isinstance(default, int | float) and not isinstance(default, bool)
    return parameter.annotation in (int, float, "int", "float")


def _expected(cls: type, name: str, default: Any) -> str:
    """'lr must be a number >= 0', or the class's default when no rule is known."""
    if name in EXPECTED:
        return f"{name} must be {EXPECTED[name]}"
    if default is not inspect.Parameter.empty:
        return f"{cls.__name__}'s default is {default!r}"
    return ""


def _check_kwargs(cls: type, kwargs: Mapping[str, Any], skip: int, key: Key, where: Where) -> None:
    parameters = _parameters(cls, skip)
    problems = []
    for name, value in kwargs.items():
        here, subject = where(*key, name), dotted((*key, name))
        if name not in parameters:
            hint = did_you_mean(name, parameters) or f"arguments: {', '.join(parameters)}"
            problems.append(Problem(here, subject, f"is not an argument of {cls.__name__}", hint))
            continue
        default = parameters[name].default
        wants_number = _wants_number(parameters[name])
        if value is None and default is not None:
            # CosineAnnealingLR(T_max=None) is built without a word and fails at the first
            # step; a null here is most often an interpolation of a key that is not set.
            message = f"is null, but {cls.__name__} needs a value"
            hint = "an interpolation such as ${training.terminal_conditions.epoch_limit} is null "
            hint += "when that key is not set; give a value"
            problems.append(Problem(here, subject, message, hint))
        elif isinstance(value, str) and (wants_number or isinstance(default, bool)):
            kind = "a number" if wants_number else "true or false"
            message = f"expected {kind}, got {value!r}"
            problems.append(Problem(here, subject, message, _expected(cls, name, default)))
        elif wants_number and isinstance(value, bool):
            message = f"expected a number, got {value!r}"
            problems.append(Problem(here, subject, message, _expected(cls, name, default)))
    if problems:
        raise ConfigError(problems)


def _refused_values(cls: type, kwargs: Mapping[str, Any], key: Key, where: Where) -> list[Problem]:
    """A Problem for each argument that torch refuses on its own (`lr=-0.1`), tried on a
    throwaway parameter, named at the line or override that set it."""
    parameters = _parameters(cls, 1)
    problems = []
    for name, value in kwargs.items():
        try:
            cls([torch.nn.Parameter(torch.zeros(1))], **{name: value})
        except ValueError as error:
            message = f"{cls.__name__} refuses {value!r}: {error}"
            known = parameters.get(name)
            suggestion = _expected(cls, name, known.default if known else inspect.Parameter.empty)
            problems.append(Problem(where(*key, name), dotted((*key, name)), message, suggestion))
    return problems


def build_optimizer(
    config: Mapping[str, Any], pipeline: Pipeline, where: Where
) -> torch.optim.Optimizer:
    options = {k: v for k, v in config.items() if k not in ("type", "param_groups")}
    cls = _lookup(
        torch.optim,
        torch.optim.Optimizer,
        config.get("type", "Adam"),
        ("training", "optimizer", "type"),
        where,
    )
    _check_kwargs(cls, options, 1, ("training", "optimizer"), where)
    group_settings: Mapping[str, Mapping[str, Any]] = config.get("param_groups") or {}
    groups: list[dict[str, Any]] = []
    grouped: set[str] = set()
    for name, settings in group_settings.items():
        if name not in pipeline.components:
            raise ConfigError.at(
                where("training", "optimizer", "param_groups"),
                f"param_groups '{name}'",
                "names no component",
                did_you_mean(name, pipeline.components),
            )
        group_key = ("training", "optimizer", "param_groups", name)
        _check_kwargs(cls, settings, 1, group_key, where)
        refused = _refused_values(cls, settings, group_key, where)
        if refused:
            raise ConfigError(refused)
        params = [p for p in pipeline.components[name].parameters() if p.requires_grad]
        if params:
            groups.append({"params": params, **settings})
        grouped.add(name)
    rest = [
        p
        for n, c in pipeline.components.items()
        if n not in grouped
        for p in c.parameters()
        if p.requires_grad
    ]
    if rest:
        groups.insert(0, {"params": rest})
    if not groups:
        groups = [{"params": [torch.nn.Parameter(torch.zeros(()), requires_grad=False)]}]
    try:
        return cls(groups, **options)
    except (TypeError, ValueError) as error:
        key: Key = ("training", "optimizer")
        problems = _refused_values(cls, options, key, where)
        raise ConfigError(problems or [Problem(where(*key), dotted(key), str(error))]) from error


def build_scheduler(
    config: Mapping[str, Any] | None,
    optimizer: torch.optim.Optimizer,
    where: Where,
    key: Key = ("training", "scheduler"),
) -> Any:
    """The scheduler that `config` (the mapping at `key`) describes, or None."""
    if not config:
        return None
    options = {k: v for k, v in config.items() if k not in ("type", "interval")}
    # SequentialLR and ChainedScheduler take scheduler objects: each entry of `schedulers`
    # that is a mapping is built here on the same optimizer, so that a warm-up (LinearLR,
    # then CosineAnnealingLR from the milestone on) is written in the config.
    inner = options.get("schedulers")
    if isinstance(inner, Sequence) and not isinstance(inner, str):
        options["schedulers"] = [
            build_scheduler(entry, optimizer, where, (*key, "schedulers", index))
            if isinstance(entry, Mapping)
            else entry
            for index, entry in enumerate(inner)
        ]
    scheduler_base = torch.optim.lr_scheduler.LRScheduler
    cls = _lookup(
        torch.optim.lr_scheduler,
        scheduler_base,
        str(config.get("type")),
        (*key, "type"),
        where,
    )
    if cls is torch.optim.lr_scheduler.ReduceLROnPlateau or cls is scheduler_base:
        raise ConfigError.at(
            where(*key, "type"),
            f"{dotted(key)}.type '{cls.__name__}'",
            "is not a schedule the loop can step: it steps on a monitored value"
            if cls is not scheduler_base
            else "is the base class of the schedulers",
            "use a schedule of steps or epochs (StepLR, CosineAnnealingLR, OneCycleLR, ...), "
            "and early stopping for a plateau",
        )
    _check_kwargs(cls, options, 1, key, where)
    try:
        return cls(optimizer, **options)
    except (TypeError, ValueError) as error:
        raise ConfigError.at(where(*key), dotted(key), str(error)) from error


@contextlib.contextmanager
def checking_only() -> Iterator[None]:
    """A block that builds optimizers only to check their arguments (`loom check`), without
    importing torch._dynamo, which takes a second on a CPU: torch wraps
    `Optimizer.add_param_group` in its "disable dynamo" decorator, which imports dynamo on the
    first call to fetch the disabled version, a version that matters only while dynamo traces
    the call. Here the undecorated function stands in for it, as the decorator's own cache
    would hold it; a torch whose decorator looks otherwise is left as it is."""
    function = getattr(torch.optim.Optimizer.add_param_group, "__wrapped__", None)
    cache = "__dynamo_disable"  # the attribute torch._compile._disable_dynamo caches into
    if function is None or "torch._dynamo" in sys.modules or hasattr(function, cache):
        yield
        return
    setattr(function, cache, function)
    try:
        yield
    finally:
        delattr(function, cache)
