"""Events of a training run, for everything that is not the loop itself (analysis, viewers).

A hook observes; it never changes training (with compiled models, a step a hook asks to see
eagerly computes the same thing with eager kernels, rounded as those round). The loop calls,
in order:

    before_train(run)
    per training batch:   needs_eager_step(run)             only when models are compiled
                          after_step(run, batch, loss)      cheap: no host sync, O(1) memory
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

import time
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

    def needs_eager_step(self, run: RunState) -> bool:
        """Whether the coming training step must run compiled models eagerly: torch.compile
        neither calls nor notices forward hooks registered on a compiled model's layers after
        it compiled, so a hook that observes a step through them asks for this."""
        return False

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
    """The hooks of one run, called in the order given. `seconds` adds up the time spent in
    them per event, so a run can say what its analysis cost (and a benchmark can measure it
    directly, not only as the difference of two noisy wall times)."""

    def __init__(self, hooks: Sequence[Hook] = ()) -> None:
        self.hooks = list(hooks)
        self.seconds: dict[str, float] = {}
        self.in_training = 0.0  # seconds in hooks until the training loop ended

    def __bool__(self) -> bool:
        return bool(self.hooks)

    def _call(self, event: str, *args: Any) -> None:
        if not self.hooks:
            return
        started = time.perf_counter()
        for hook in self.hooks:
            getattr(hook, event)(*args)
        self.seconds[event] = self.seconds.get(event, 0.0) + time.perf_counter() - started

    def total(self) -> float:
        """Seconds spent in the hooks so far."""
        return sum(self.seconds.values())

    def training_ended(self) -> None:
        """Mark the end of the training loop: what the hooks cost from here on (the test
        pass, the final plots) is paid once per run, not per epoch."""
        self.in_training = self.total()

    def before_train(self, run: RunState) -> None:
        self._call("before_train", run)

    def needs_eager_step(self, run: RunState) -> bool:
        return any(hook.needs_eager_step(run) for hook in self.hooks)

    def after_step(self, run: RunState, batch: Batch, loss: torch.Tensor) -> None:
        self._call("after_step", run, batch, loss)

    def after_interval(self, run: RunState) -> None:
        self._call("after_interval", run)

    def after_training_epoch(self, run: RunState, values: dict[str, Any]) -> None:
        self._call("after_training_epoch", run, values)

    def eval_batch(self, run: RunState, section: str, batch: Batch) -> None:
        self._call("eval_batch", run, section, batch)

    def after_eval(
        self, run: RunState, section: str, values: dict[str, Any], partial: bool
    ) -> None:
        self._call("after_eval", run, section, values, partial)

    def after_train(self, run: RunState, summary: dict[str, Any]) -> None:
        self._call("after_train", run, summary)

    def state_dict(self) -> dict[str, Any]:
        return {hook.name: hook.state_dict() for hook in self.hooks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for hook in self.hooks:
            if hook.name in state:
                hook.load_state_dict(state[hook.name])
