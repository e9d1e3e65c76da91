"""Tells the components that change with training progress that an epoch starts
(`Component.start_epoch`): before the first one (or the one a resumed run continues in) and
after each one. A hook, so that the training loop stays as it is; it runs on every process,
unlike the analysis hooks, since it changes what the model computes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchloom.core.component import Component
from torchloom.core.pipeline import Pipeline
from torchloom.engine.state import Hook, RunView


class EpochStart(Hook):
    name = "epoch_start"

    def __init__(self, components: Sequence[Component]) -> None:
        self.components = list(components)

    def before_train(self, run: RunView) -> None:
        self._start(run.progress.epoch)

    def after_training_epoch(self, run: RunView, values: dict[str, Any]) -> None:
        self._start(run.progress.epoch)  # the epochs completed: the next one's index

    def _start(self, epoch: int) -> None:
        for component in self.components:
            component.start_epoch(epoch)


def epoch_hooks(pipeline: Pipeline) -> list[Hook]:
    """[EpochStart] when a component of the pipeline overrides start_epoch, else nothing (a
    run without one has no hook more)."""
    listening = [
        c for c in pipeline.components.values() if type(c).start_epoch is not Component.start_epoch
    ]
    return [EpochStart(listening)] if listening else []
