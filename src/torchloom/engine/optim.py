"""Optimizer and scheduler from config: any torch.optim / lr_scheduler class by name.

Keyword arguments are checked against the class's signature before it is called, so a
misspelt `lr` is a config error with a suggestion. `param_groups` gives components their
own settings (e.g. a smaller learning rate for a pretrained encoder).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from torchloom.core.pipeline import Pipeline
from torchloom.errors import ConfigError, Problem, did_you_mean

Where = Callable[..., str]
Key = tuple[str | int, ...]  # a key path in the config, list positions as ints


def dotted(key: Key) -> str:
    """'training.scheduler.schedulers[1].type' for a key path."""
    text = ""
    for part in key:
        text += f"[{part}]" if isinstance(part, int) else f"{'.' if text else ''}{part}"
    return text


def _lookup(module: Any, base: type, name: str, key: Key, where: Where) -> type:
    candidates = [
        n
        for n, v in vars(module).items()
        if inspect.isclass(v) and issubclass(v, base) and not n.startswith("_")
    ]
    cls = getattr(module, name, None)
    if not (inspect.isclass(cls) and issubclass(cls, base)):
        raise ConfigError(
            [
                Problem(
                    where(*key),
                    f"{dotted(key)} '{name}'",
                    f"is not a {module.__name__} class",
                    did_you_mean(name, candidates),
                )
            ]
        )
    return cls


def _check_kwargs(cls: type, kwargs: Mapping[str, Any], skip: int, key: Key, where: Where) -> None:
    parameters = list(inspect.signature(cls).parameters)[skip:]
    problems = [
        Problem(
            where(*key, name),
            dotted((*key, name)),
            f"is not an argument of {cls.__name__}",
            did_you_mean(name, parameters) or f"arguments: {', '.join(parameters)}",
        )
        for name in kwargs
        if name not in parameters
    ]
    if problems:
        raise ConfigError(problems)


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
            raise ConfigError(
                [
                    Problem(
                        where("training", "optimizer", "param_groups"),
                        f"param_groups '{name}'",
                        "names no component",
                        did_you_mean(name, pipeline.components),
                    )
                ]
            )
        _check_kwargs(cls, settings, 1, ("training", "optimizer", "param_groups", name), where)
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
        raise ConfigError(
            [Problem(where("training", "optimizer"), "training.optimizer", str(error))]
        ) from error


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
    _check_kwargs(cls, options, 1, key, where)
    try:
        return cls(optimizer, **options)
    except (TypeError, ValueError) as error:
        raise ConfigError([Problem(where(*key), dotted(key), str(error))]) from error
