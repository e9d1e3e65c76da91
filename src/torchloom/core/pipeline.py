"""The built pipeline: tasks per section and components in execution order.

Running a batch routes each component's inputs from the batch by their pipeline-wide names,
calls the component with its default names, and publishes its outputs under pipeline-wide
names. Routes are computed once at build time, so a step costs a few dict look-ups per
component and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from torchloom.core.component import Batch, Component, Loss, Model, Statistic, Task
from torchloom.core.first_batch import FirstBatchCheck, check_task_batch
from torchloom.core.globals_store import GlobalsStore

if TYPE_CHECKING:
    from torchloom.core.component_entry import ComponentEntry


class _Route:
    """One component with its (default name, pipeline name) pairs for inputs and outputs."""

    __slots__ = ("call", "component", "inputs", "outputs")

    def __init__(self, component: Component) -> None:
        self.component = component
        self.call: Callable[[Batch], Batch] = component  # a DDP wrapper, for models under DDP
        self.inputs = [(key, component.stream_name(key)) for key in component.input_specs()]
        self.outputs = {key: component.stream_name(key) for key in component.output_specs()}


class Pipeline(nn.Module):
    """All components of one config; `forward(batch)` runs them in order and returns the batch
    with every produced stream added."""

    def __init__(
        self,
        tasks: Mapping[str, Task],
        components: Iterable[Component],
        store: GlobalsStore,
        entries: Mapping[str, ComponentEntry],
    ) -> None:
        super().__init__()
        ordered = list(components)
        # The ModuleDict registers the weights (device moves, parameters()); the plain dict is
        # the typed view everything else uses. Same objects, in execution order.
        self.registered = nn.ModuleDict({c.name: c for c in ordered})
        self.components: dict[str, Component] = {c.name: c for c in ordered}
        # Tasks hold data, not weights: a plain dict keeps them out of state_dict().
        self.tasks: dict[str, Task] = dict(tasks)
        self.globals = store
        self.entries = dict(entries)
        # Statistics run apart from the rest: workers keep one copy per section (training
        # and validation sets are aggregated separately) and feed them the same inputs.
        self._routes = [_Route(c) for c in self.components.values() if not isinstance(c, Statistic)]
        self._statistic_inputs = {c.name: _Route(c).inputs for c in self.statistics}
        self._check_section: str | None = None
        self._begin_forward: Callable[[], None] | None = None

    def begin_each_forward_with(self, begin: Callable[[], None]) -> None:
        """Call `begin()` at the start of every forward. Models compiled into CUDA graphs
        need it (engine/step.compile_models): torch takes each compiled call in inference as
        a new step, whose graphs may overwrite the outputs one compiled model hands the next
        inside the same forward, unless the step's start is marked."""
        self._begin_forward = begin

    def start_epoch(self, epoch: int) -> None:
        """A training epoch starts (`epoch` epochs trained before it): told to the components
        that change with training progress (`Component.start_epoch`, e.g. a drop-path ramp)."""
        for component in self.components.values():
            if type(component).start_epoch is not Component.start_epoch:
                component.start_epoch(epoch)

    def check_next_batch(self, section: str) -> None:
        """Check the next batch's streams against every producer's specs (workers call this
        before the first batch of each pass; see first_batch.py)."""
        self._check_section = section

    def forward(self, batch: Batch) -> Batch:
        """Run every component but the statistics, adding their outputs to the batch."""
        if self._begin_forward is not None:
            self._begin_forward()
        if self._check_section is not None:
            return self._forward_checked(batch, self._check_section)
        for route in self._routes:
            inputs = {key: batch[name] for key, name in route.inputs}
            outputs = route.call(inputs)
            for key, value in outputs.items():
                batch[route.outputs[key]] = value
        return batch

    def wrap_models(self, wrap: Callable[[Model], Callable[[Batch], Batch]]) -> list[str]:
        """Run every model with trainable weights through `wrap(model)` (DistributedDataParallel
        when several processes train); components, state dicts and checkpoints stay the
        models' own. Returns the names of the wrapped models."""
        wrapped = []
        for route in self._routes:
            component = route.component
            if isinstance(component, Model) and any(
                p.requires_grad for p in component.parameters()
            ):
                route.call = wrap(component)
                wrapped.append(component.name)
        return wrapped

    def wrappers(self) -> list[Any]:
        """What `wrap_models` put around the models (DistributedDataParallel), in order."""
        return [r.call for r in self._routes if r.call is not r.component]

    def _forward_checked(self, batch: Batch, section: str) -> Batch:
        task = self.tasks.get(section)
        sizes = {} if task is None else task.dimension_sizes()
        sizes = {task.dim_name(k): v for k, v in sizes.items()} if task is not None else {}
        check = FirstBatchCheck(section, sizes)
        if task is not None:
            check_task_batch(check, task, batch)
        for route in self._routes:
            inputs = {key: batch[name] for key, name in route.inputs}
            outputs = route.call(inputs)
            check.check(route.component, outputs)
            for key, value in outputs.items():
                batch[route.outputs[key]] = value
        self._check_section = None
        return batch

    def update_statistics(self, batch: Batch, statistics: Mapping[str, Statistic]) -> None:
        """Feed a batch to statistics (the pipeline's own, or per-section copies by name)."""
        with torch.no_grad():
            for name, statistic in statistics.items():
                statistic.update(
                    {
                        key: _without_graph(batch[stream])
                        for key, stream in self._statistic_inputs[name]
                    }
                )

    def rename_task_outputs(self, section: str, batch: Batch) -> Batch:
        """A task's collated batch, keyed by pipeline-wide stream names."""
        task = self.tasks[section]
        return {task.stream_name(key): value for key, value in batch.items()}

    def of_family(self, family: type[Component]) -> list[Component]:
        return [c for c in self.components.values() if isinstance(c, family)]

    @property
    def losses(self) -> list[Loss]:
        return [c for c in self.components.values() if isinstance(c, Loss)]

    @property
    def statistics(self) -> list[Statistic]:
        return [c for c in self.components.values() if isinstance(c, Statistic)]

    @property
    def models(self) -> list[Model]:
        return [c for c in self.components.values() if isinstance(c, Model)]

    def component_states(self) -> dict[str, dict]:
        """Weights per component name: what checkpoints store and `load:` reads back."""
        return {name: c.state_dict() for name, c in self.components.items()}


def _without_graph(value: Any) -> Any:
    """A stream as statistics may keep it: detached from the autograd graph where it is in one
    (a target or an index is not: no call for them, as this runs on every training step)."""
    return value.detach() if isinstance(value, torch.Tensor) and value.requires_grad else value
