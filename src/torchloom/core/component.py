"""Component base classes: the units a pipeline is made of.

A component is an `nn.Module` that reads named input streams and returns named output
streams; it never calls another component. It declares

- `Params`: a pydantic model; the field descriptions are its documentation;
- `input_specs()` / `output_specs()`: a `StreamSpec` per stream, under the component's own
  (default) stream names; a config's `streams:` mapping renames them, and the pipeline does
  the renaming so that `forward` only ever sees default names;
- `NEEDS_GLOBALS` / `PUBLISHES_GLOBALS`: the globals it reads and writes at build time, also
  under default names that a config's `globals:` mapping renames.

Families: `Task` (a data source), `Model` (trainable weights), `Loss`, `Statistic`, and plain
components (tokenizers, reshapers, viewers, ...).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

import torch
from pydantic import ConfigDict
from torch import nn

from torchloom.config_model import ConfigModel
from torchloom.core.globals_store import GlobalsStore
from torchloom.core.streams import StreamSpec
from torchloom.errors import Problem, Where

Batch = dict[str, Any]


class ComponentParams(ConfigModel):
    """Base of every component's parameter schema: unknown keys are errors, never ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass
class BuildContext:
    """What a component sees while it is built: its renames, the globals, where it was declared.

    Built by the pipeline builder; `standalone()` makes one for use outside a config (tests,
    notebooks): `LeNet5.create(dropout=0.1, globals={"prediction_size": 10})`.
    """

    name: str
    stream_names: Mapping[str, str] = field(default_factory=dict)
    global_names: Mapping[str, str] = field(default_factory=dict)
    store: GlobalsStore = field(default_factory=GlobalsStore)
    where: Where = field(default=lambda *keys: "")
    label: str = ""  # e.g. "component 'image_classifier' (LeNet5)"
    # The training section's task, for components that fit something to the training data
    # at build time (a vocabulary from the training texts); None in `create()` and in
    # configs without a training task. A callable, because tasks are built first.
    training_task: Callable[[], Task | None] = field(default=lambda: None)
    # `dims:` renames of symbolic dimension names (default -> pipeline-wide), e.g. a second
    # head's {classes: parity_classes}, so that it is not held to the task's `classes`.
    dim_names: Mapping[str, str] = field(default_factory=dict)


class Component(nn.Module):
    """Base of all components. Subclasses set `Params` and override the spec methods."""

    family: ClassVar[str] = "component"
    Params: ClassVar[type[ComponentParams]] = ComponentParams
    NEEDS_GLOBALS: ClassVar[Mapping[str, str]] = {}  # default name -> description
    PUBLISHES_GLOBALS: ClassVar[Mapping[str, str]] = {}  # default name -> description
    # Globals that documentation (`loom components NAME`) builds an example instance with,
    # so it can show concrete stream shapes. Never used by a pipeline.
    EXAMPLE_GLOBALS: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, params: ComponentParams, context: BuildContext) -> None:
        super().__init__()
        self.name = context.name
        self.params = params
        self._context = context
        self.frozen = False
        self.build_notes: list[str] = []  # see note()

    # ---- construction helpers -------------------------------------------------------------
    @classmethod
    def create(
        cls, *, name: str | None = None, globals: Mapping[str, Any] | None = None, **params: Any
    ) -> Component:
        """Build a component outside a pipeline, with the given globals already published."""
        store = GlobalsStore()
        for key, value in (globals or {}).items():
            store.publish(key, value, "create()")
        context = BuildContext(name=name or cls.__name__.lower(), store=store)
        return cls(cls.Params(**params), context)

    @classmethod
    def needed_globals(cls, params: ComponentParams) -> Mapping[str, str]:
        """Globals read at build time (default names); override when they depend on params."""
        return cls.NEEDS_GLOBALS

    @classmethod
    def published_globals(cls, params: ComponentParams) -> Mapping[str, str]:
        """Globals written at build time (default names); override when they depend on params."""
        return cls.PUBLISHES_GLOBALS

    def global_value(self, key: str) -> Any:
        """The value of a needed global, by its default name (renames applied)."""
        actual = self._context.global_names.get(key, key)
        return self._context.store.get(actual, self.label, self._context.where("globals"))

    def publish_global(self, key: str, value: Any) -> None:
        actual = self._context.global_names.get(key, key)
        self._context.store.publish(actual, value, self.label, self._context.where())

    def note(self, message: str) -> None:
        """Record something worth knowing about how this component was built ("9,512 of
        9,774 words found in glove.6B.300d.txt"). Building happens before a run has a log,
        so notes are kept: `loom check` prints them and every run writes them to its log."""
        self.build_notes.append(message)

    def training_task(self) -> Task | None:
        """The training section's task (built before every other component), or None."""
        return self._context.training_task()

    def where(self, *keys: str) -> str:
        """`file:line` of one of this component's config keys, for error messages."""
        return self._context.where(*keys)

    # ---- naming ---------------------------------------------------------------------------
    @property
    def label(self) -> str:
        return self._context.label or f"component '{self.name}' ({type(self).__name__})"

    def stream_name(self, key: str) -> str:
        """The pipeline-wide name of one of this component's default stream names."""
        return self._context.stream_names.get(key, key)

    def dim_name(self, name: str) -> str:
        """The pipeline-wide name of one of this component's symbolic dimension names."""
        return self._context.dim_names.get(name, name)

    def pipeline_specs(self, specs: Mapping[str, StreamSpec]) -> dict[str, StreamSpec]:
        """Specs with the config's `dims:` renames applied: what the handshake checks."""
        names = self._context.dim_names
        return {key: spec.with_dim_names(names) for key, spec in specs.items()}

    def dimension_names(self) -> set[str]:
        """Every symbolic dimension name this component's specs use (default names)."""
        specs = [*self.input_specs().values(), *self.output_specs().values()]
        return {d.name for s in specs for d in (s.dims or ()) if d.name is not None}

    # ---- the contract -----------------------------------------------------------------------
    def input_specs(self) -> dict[str, StreamSpec]:
        return {}

    def output_specs(self) -> dict[str, StreamSpec]:
        return {}

    def forward(self, inputs: Batch) -> Batch:  # default stream names in, default names out
        raise NotImplementedError(f"{type(self).__name__} does not implement forward()")

    # ---- passes ---------------------------------------------------------------------------
    def begin_pass(self, section: str, folder: Path) -> None:
        """A worker starts an evaluation pass whose files go into `folder` (exporters and
        viewers write there; components never choose folders themselves)."""

    def end_pass(self) -> None:
        """The pass has ended: flush and close whatever `begin_pass` opened."""

    def artifacts(self) -> Mapping[str, str]:
        """Files that describe what this component was built with (a vocabulary it built from
        the training data): {file name: text}. Workers write them into the run folder, under
        `artifacts/<component name>/`, before the first batch; never into a data folder."""
        return {}

    # ---- training progress -------------------------------------------------------------------
    def start_epoch(self, epoch: int) -> None:
        """A training epoch starts; `epoch` counts the epochs trained before it (0 for the
        first, the epoch a resumed run continues in). Called on every process, before the
        epoch's first step, only for components that override it: for what a component
        changes with training progress (DARTS's drop-path ramp). Nothing by default."""

    # ---- freezing ---------------------------------------------------------------------------
    def freeze(self) -> None:
        """Stop training this component: no gradients, and eval mode kept for good (BatchNorm
        statistics and Dropout are frozen too)."""
        self.frozen = True
        for parameter in self.parameters():
            parameter.requires_grad_(False)
        super().train(False)

    def train(self, mode: bool = True) -> Component:
        super().train(mode and not self.frozen)
        return self

    def parameter_counts(self) -> tuple[int, int]:
        """(trainable, frozen) parameter counts."""
        trainable = sum(p.numel() for p in self.parameters() if p.requires_grad)
        total = sum(p.numel() for p in self.parameters())
        return trainable, total - trainable


class Model(Component):
    """A component with trainable weights."""

    family = "model"


class Loss(Component):
    """Reads predictions and targets, writes a scalar `loss` stream that training minimises."""

    family = "loss"

    def output_specs(self) -> dict[str, StreamSpec]:
        return {"loss": StreamSpec((), (torch.float32, torch.float64), "scalar loss of the batch")}

    def elements(self, batch: Batch) -> torch.Tensor | None:
        """How many elements the batch's loss is the mean of, when not its samples (the steps
        a sequence loss counts): an evaluation weighs each batch's loss by it, so that a set's
        loss does not depend on how the set is batched. None: the batch's samples."""
        return None


class Statistic(Component):
    """Collects per-batch values and aggregates them over a whole set.

    `update` is called on every batch (that is what `forward` does), `compute` returns the
    set-level values by name, `reset` starts a new set. Aggregates come from global counts,
    never from means of per-batch values.
    """

    family = "statistic"

    def forward(self, inputs: Batch) -> Batch:
        self.update(inputs)
        return {}

    def ready(self) -> None:
        """Create what counting needs, when that is costly to import (torchmetrics takes
        seconds): the workers call it on the copies they count with, before restoring a
        checkpoint into them; `loom check` never does. Idempotent; nothing by default."""

    def count_persistently(self) -> None:
        """Put the running counts into `state_dict()`. The engine calls it on the copies it
        counts a section with, whose counts go into checkpoints (exact mid-epoch resume) and
        travel between processes; the pipeline's own statistic saves no counts, so its
        checkpoint entry stays empty. By default: every torchmetrics `Metric` inside."""
        # torchmetrics is imported by the statistics that use it, not here: importing it
        # costs seconds (it pulls in torchvision and torch._dynamo). No such module, no Metric.
        metrics = sys.modules.get("torchmetrics")
        if metrics is None:
            return
        for module in self.modules():
            if isinstance(module, metrics.Metric):
                module.persistent(True)

    def update(self, inputs: Batch) -> None:
        raise NotImplementedError

    def merge(self, other: Statistic) -> None:
        """Add another copy's counts (same settings) to this one's. Optional: a statistic
        that can merge is updated once per training step instead of twice (the workers keep
        the epoch's and the logging interval's counts apart by merging at their ends)."""
        raise NotImplementedError

    def add_buffers_of(self, other: Statistic) -> None:
        """Add every buffer of `other` (a copy with the same settings) to this one's: the
        whole `merge` of a statistic whose buffers are all counts."""
        theirs = dict(other.named_buffers())
        for name, mine in self.named_buffers():
            assert theirs[name].shape == mine.shape, f"{name}: copies of other settings"
            mine.add_(theirs[name].to(mine.device))

    @property
    def can_merge(self) -> bool:
        return type(self).merge is not Statistic.merge

    def compute(self) -> dict[str, float]:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError


class Task(Component, torch.utils.data.Dataset):
    """A data source: a dataset of samples (dicts of default stream names) plus a collate.

    `prepare()` reads the data; it is called by workers before iterating, never by the
    handshake, so `loom check` reads no data. Output specs describe *batches*.
    """

    family = "task"

    def prepare(self) -> None:
        """Locate, verify and load the data. Idempotent."""

    def dimension_sizes(self) -> dict[str, int]:
        """Sizes of symbolic dimensions the task knows (e.g. {'classes': 10}), which the
        handshake holds every other component to."""
        return {}

    def sample_targets(self) -> torch.Tensor | None:
        """One class index per sample (1-D int tensor), for class-balanced sampling; None
        when the task has no class targets."""
        return None

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, index: int) -> Batch:
        raise NotImplementedError

    @staticmethod
    def checked_index(index: int, size: int, unit: str = "samples") -> int:
        """`index` as a position in [0, size): negative ones count from the end, as for a
        list; anything else is an IndexError (which also ends plain iteration over a task)."""
        position = index + size if index < 0 else index
        if not 0 <= position < size:
            raise IndexError(f"index {index} out of range for {size} {unit}")
        return position

    @classmethod
    def checked_positions(cls, indices: Sequence[int], size: int) -> torch.Tensor:
        """`checked_index` of each of `indices`, as a 1-D int64 tensor: the positions a
        `fetch` that gathers from tensors indexes them with. Checked by the least and greatest
        index rather than index by index, on every batch a loader reads: 18 us for 256
        indices, most of it making the tensor, against 24 us."""
        positions = torch.as_tensor(indices, dtype=torch.int64)
        if positions is indices:  # a tensor of positions: the batch gets its own
            positions = positions.clone()
        if not len(positions):
            return positions
        low, high = min(indices), max(indices)  # Python's: no tensor calls
        if low < -size or high >= size:
            first_bad = next(i for i in indices if not -size <= i < size)
            cls.checked_index(first_bad, size)  # raises its IndexError
        return positions if low >= 0 else torch.where(positions < 0, positions + size, positions)

    def collate(self, samples: list[Batch]) -> Batch:
        return dict(torch.utils.data.default_collate(samples))

    # True for a task whose `fetch` also takes `draws=(seed, draw numbers)` (one number per
    # index, unique among one loader's): its random transforms draw from those alone, so a
    # sample's augmentation is the same whichever process, worker or batch reads it
    # (zoo/image_transforms.keyed_uniform; the loaders pass them: engine/loaders.KeyedDraws).
    keyed_draws = False

    def fetch(self, indices: Sequence[int]) -> Batch:
        """The batch of the samples at `indices`: `collate` of each `self[index]`. The loaders
        ask for whole batches through this, so a task that holds its data in tensors can
        override it to gather a batch in a few tensor operations instead of one Python call
        per sample (the same batch, which a test of such a task should check)."""
        return self.collate([self[index] for index in indices])

    # What `hold_on` copied to a device, by name, which `fetch` gathers from when not empty.
    # Read-only here; `hold_on` gives the task a dict of its own.
    held: Mapping[str, torch.Tensor] = MappingProxyType({})

    def tensors_to_hold(self) -> dict[str, torch.Tensor] | None:
        """The host's tensors `fetch` gathers from and computes with, by name, which
        `dataloader.on_device` copies to the run's device (`hold_on`); None, the default,
        when the task builds its samples one by one (from files, from text)."""
        return None

    def hold_on(self, device: torch.device) -> bool:
        """Copy `tensors_to_hold` to `device` once, so that `fetch` gathers its batches there
        (`dataloader.on_device`); samples read one at a time (`self[i]`) stay on the host.
        False, and nothing changes, when the task cannot. A task that overrides
        `tensors_to_hold` reads `held` in its `fetch`, whose batches must stay the same
        wherever they are built."""
        tensors = self.tensors_to_hold()
        if tensors is None:
            return False
        already = next(iter(self.held.values()), None)
        if already is None or not _on_the_device(already, device):  # else a second loader's
            self.held = {name: tensor.to(device) for name, tensor in tensors.items()}
        return True

    def split_problems(self, training: Task) -> list[Problem]:
        """Why this (validation or test) task's split cannot be held apart from `training`'s
        (a task that draws its splits from one collection); none by default."""
        return []

    def texts(self, stream: str) -> Iterator[Any]:
        """Every sample's value of one output stream (default name), in sample order, for
        components that fit themselves to the training data (vocabularies). Text tasks
        override it to read only that stream instead of whole samples (images included)."""
        self.prepare()
        for index in range(len(self)):
            yield self[index][stream]


def _on_the_device(tensor: torch.Tensor, device: torch.device) -> bool:
    """Whether `tensor` lies on `device` (`cuda` without an index: the current GPU)."""
    index = device.index
    if index is None and device.type == "cuda":
        index = torch.cuda.current_device()
    return tensor.device.type == device.type and (index is None or tensor.device.index == index)
