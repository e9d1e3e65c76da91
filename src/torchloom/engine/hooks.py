"""Events of a training run, for everything that is not the loop itself (analysis, viewers).

A hook observes; it never changes training. The loop calls, in order:

    before_train(run)
    per training batch:   after_step(run, batch, loss)      cheap: no host sync, O(1) memory
    at logging intervals: after_interval(run)
    after each epoch:     after_training_epoch(run, values)
    evaluation passes:    eval_batch(run, section, batch)   every batch of validation / test
                          after_eval(run, section, values, partial)
    after_train(run, summary)

`run` is the `RunState` (pipeline, folders, progress, logger). Hooks that keep state across
epochs (a worst-samples history) save it with `state_dict()` into checkpoints, so a resumed
run continues it. The engine never imports the analysis package: whoever starts a run (the
CLI, the Python API) builds the hooks and hands them over.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from torchloom.core.component import Batch

if TYPE_CHECKING:
    from torchloom.engine.run_state import RunState


class Hook:
    """Base class: override the events you need. `name` keys its checkpoint state."""

    name = "hook"

    def before_train(self, run: RunState) -> None: ...

    def after_step(self, run: RunState, batch: Batch, loss: torch.Tensor) -> None: ...

    def after_interval(self, run: RunState) -> None: ...

    def after_training_epoch(self, run: RunState, values: dict[str, Any]) -> None: ...

    def eval_batch(self, run: RunState, section: str, batch: Batch) -> None: ...

    def after_eval(
        self, run: RunState, section: str, values: dict[str, Any], partial: bool
    ) -> None: ...

    def after_train(self, run: RunState, summary: dict[str, Any]) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Hooks:
    """The hooks of one run, called in the order given."""

    def __init__(self, hooks: Sequence[Hook] = ()) -> None:
        self.hooks = list(hooks)

    def __bool__(self) -> bool:
        return bool(self.hooks)

    def before_train(self, run: RunState) -> None:
        for hook in self.hooks:
            hook.before_train(run)

    def after_step(self, run: RunState, batch: Batch, loss: torch.Tensor) -> None:
        for hook in self.hooks:
            hook.after_step(run, batch, loss)

    def after_interval(self, run: RunState) -> None:
        for hook in self.hooks:
            hook.after_interval(run)

    def after_training_epoch(self, run: RunState, values: dict[str, Any]) -> None:
        for hook in self.hooks:
            hook.after_training_epoch(run, values)

    def eval_batch(self, run: RunState, section: str, batch: Batch) -> None:
        for hook in self.hooks:
            hook.eval_batch(run, section, batch)

    def after_eval(
        self, run: RunState, section: str, values: dict[str, Any], partial: bool
    ) -> None:
        for hook in self.hooks:
            hook.after_eval(run, section, values, partial)

    def after_train(self, run: RunState, summary: dict[str, Any]) -> None:
        for hook in self.hooks:
            hook.after_train(run, summary)

    def state_dict(self) -> dict[str, Any]:
        return {hook.name: hook.state_dict() for hook in self.hooks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for hook in self.hooks:
            if hook.name in state:
                hook.load_state_dict(state[hook.name])
