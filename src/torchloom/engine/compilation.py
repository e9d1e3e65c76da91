"""`training.compile`: the pipeline's models compiled with torch.compile, opt-in.

Each `Model` component with weights is compiled in place (`nn.Module.compile`), so its
state_dict keys, checkpoints, freezing and `load:` are exactly those of the eager model; the
rest of the pipeline (tasks, losses, statistics, the training loop) stays eager. On a GPU
`mode: reduce-overhead` replays the models' kernels as CUDA graphs, which is what a small
model whose step is bound by Python and kernel launches needs; the first steps are slower
while torch compiles. The options are checked without compiling, so `loom check` rejects a
misspelt one.

A compiled model neither calls nor notices forward hooks registered on its layers after it
compiled (torch does not guard on them), so the passes that observe layers through forward
hooks (layer statistics' measured steps, the model summary's shapes) run `running_eagerly()`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from torchloom.core.component import Model
from torchloom.core.pipeline import Pipeline
from torchloom.errors import ConfigError, Problem, did_you_mean

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile_options(
    setting: bool | Mapping[str, Any], where: Callable[..., str]
) -> dict[str, Any] | None:
    """The keyword arguments for torch.compile that `training.compile` asks for, or None
    when it is off; a ConfigError names a key torch.compile does not take or an unknown mode."""
    if setting is False:
        return None
    options = {} if setting is True else dict(setting)
    accepted = [name for name in inspect.signature(torch.compile).parameters if name != "model"]
    problems = [
        Problem(
            where("training", "compile", key),
            f"training.compile.{key}",
            "is not an argument of torch.compile",
            did_you_mean(key, accepted) or f"arguments: {', '.join(accepted)}",
        )
        for key in options
        if key not in accepted
    ]
    mode = options.get("mode")
    if mode is not None and mode not in MODES:
        problems.append(
            Problem(
                where("training", "compile", "mode"),
                "training.compile.mode",
                f"is {mode!r}, not a torch.compile mode",
                did_you_mean(str(mode), list(MODES)) or f"modes: {', '.join(MODES)}",
            )
        )
    if problems:
        raise ConfigError(problems)
    return options


def compile_models(pipeline: Pipeline, options: dict[str, Any]) -> list[str]:
    """Compile every model with weights in place; the names of those compiled."""
    compiled = []
    for name, component in pipeline.components.items():
        if isinstance(component, Model) and any(True for _ in component.parameters()):
            component.compile(**options)
            compiled.append(name)
    return compiled


def running_eagerly(needed: bool = True) -> AbstractContextManager[Any]:
    """A block in which every torch.compile'd model runs its eager forward (and restores the
    compiler's previous stance on the way out, even after an exception); a plain block when
    not `needed` (nothing compiled), which also keeps torch._dynamo from being imported."""
    return torch.compiler.set_stance("force_eager") if needed else nullcontext()
