"""DataLoaders for a section: the task as dataset (fetching whole batches), a resumable
sampler, renaming collate.

Every loader gets its own generator seeded from (seed, epoch), and the sampler's order is a
function of (seed, epoch) too, so the data a run sees never depends on how much of the global
RNG earlier code consumed — the basis of exact resume.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, cast

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from torchloom.config.schema import SectionConfig
from torchloom.core.component import Batch, Task
from torchloom.data.process_start import worker_context
from torchloom.data.rank_shard import RankShard
from torchloom.data.reservoir import AsyncReservoir
from torchloom.data.samplers import ResumableSampler, build_sampler
from torchloom.engine.checkpoint import worker_init
from torchloom.engine.epoch_batches import (
    ReservoirEpoch,
    StopAwareBatches,
    StopRequest,
    WorkerBatches,
)
from torchloom.errors import ConfigError, Problem, Where


class TaskBatches(Dataset[Batch]):
    """The task as torch's DataLoader sees it. The loader hands each batch's indices to
    `__getitems__` at once, so `Task.fetch` can build the batch in one go; `__getitem__`
    stays for code that reads single samples. With `seed`, the indices come from
    `KeyedDraws`, each with its draw number, which `fetch` gets as `draws`."""

    def __init__(self, task: Task, seed: int | None = None) -> None:
        self.task, self.seed = task, seed

    def __len__(self) -> int:
        return len(self.task)

    def __getitem__(self, index: int) -> Batch:
        return self.task[index]

    def __getitems__(self, indices: list[int]) -> Batch:
        if self.seed is None:
            return self.task.fetch(indices)
        size = len(self.task)
        draws, positions = zip(*(divmod(i, size) for i in indices), strict=True)
        fetch: Any = self.task.fetch  # a keyed task's takes draws (Task.keyed_draws)
        return fetch(list(positions), draws=(self.seed, list(draws)))


class KeyedDraws(Sampler[int]):
    """A sampler's indices, each carrying its draw number (epoch, position in the epoch's
    global order) as `draw * size + index`, for `TaskBatches` to split again in whichever
    process or worker fetches it: a sample's augmentation is then a function of the seed, the
    epoch and its position alone, the same with any number of workers or processes, on the
    host or the device, and on resume; a sample drawn twice in an epoch (with replacement)
    is augmented twice."""

    EPOCH_STRIDE = 2**32  # positions in an epoch are fewer (checked)

    def __init__(self, sampler: ResumableSampler | RankShard, size: int) -> None:
        super().__init__()
        self.sampler, self.size = sampler, size

    def __iter__(self) -> Iterator[int]:
        if self.sampler.epoch_length() >= self.EPOCH_STRIDE:
            raise ValueError(f"an epoch of {self.sampler.epoch_length()} draws is too long")
        base = self.sampler.epoch * self.EPOCH_STRIDE  # the epoch the sampler was set to
        for position, index in self.sampler.positioned():
            yield (base + position) * self.size + index

    def __len__(self) -> int:
        return len(self.sampler)


class RenamingCollate:
    """Renames the streams of a fetched batch to their pipeline-wide names (the batch is
    already collated by `Task.fetch`)."""

    def __init__(self, task: Task) -> None:
        self.names = {key: task.stream_name(key) for key in task.output_specs()}

    def __call__(self, batch: Batch) -> Batch:
        return {self.names.get(key, key): value for key, value in batch.items()}


class SectionLoader:
    """The loader of one section, re-created per epoch from (seed, epoch)."""

    def __init__(
        self,
        section: str,
        task: Task,
        config: SectionConfig,
        seed: int,
        where: Where,
        pin_memory: bool | None = None,
        rank: int = 0,
        world: int = 1,
        reservoir: bool = False,
        device: torch.device | None = None,
    ) -> None:
        """`rank`/`world`: this process's share of every global batch of `batch_size` (see
        RankShard); the config's batch size must divide among the processes. `reservoir`:
        draw from `dataloader.reservoir` when the config has one (a training run's loop;
        passes that visit each sample once, such as `loom process`, read the task in order).
        `device`: the run's device, where `dataloader.on_device` holds the task's data (the
        host when None). `pin_memory`: batches in pinned memory, for non-blocking copies to
        a GPU (by default when `device` is one; also when the config asks; never for a run
        on the host)."""
        task.prepare()
        self.section = section
        self.task = task
        self.config = config.dataloader
        self.seed = seed
        shuffle = (
            self.config.shuffle if self.config.shuffle is not None else (section == "training")
        )
        self.sampler: ResumableSampler = build_sampler(
            config.sampler,
            len(task),
            seed=seed,
            shuffle=shuffle,
            targets=task.sample_targets(),
            where=where(section, "sampler"),
        )
        batch = self.config.batch_size
        if world > 1 and batch % world:
            raise ConfigError.at(
                where(section, "dataloader", "batch_size"),
                f"{section}.dataloader.batch_size",
                f"{batch} is the global batch, and does not divide among {world} processes",
                f"use a multiple of {world}, e.g. {batch - batch % world or world}",
            )
        self.world = world
        self.shard = RankShard(self.sampler, batch, rank, world, self.config.drop_last)
        if self.batches_per_epoch() == 0:  # a training loop of no step, NaN statistics
            raise ConfigError([_no_batch(section, self.sampler.epoch_length(), config, where)])
        # The task's augmentation keyed by each sample's draw (see KeyedDraws), where it can be.
        order = self.shard if world > 1 else self.sampler
        self.keyed = KeyedDraws(order, len(task)) if task.keyed_draws else None
        self.collate = RenamingCollate(task)
        if pin_memory is None:
            pin_memory = device is not None and device.type == "cuda"
        # Pinning speeds a copy to an accelerator and needs its driver: a run on the host (a
        # GPU run's config trained or fine-tuned on a laptop) pins nothing, whatever it asks.
        on_accelerator = device is not None and device.type not in ("cpu", "meta")
        self.pin_memory = on_accelerator and (pin_memory or self.config.pin_memory)
        if self.config.on_device:
            self._hold_on(device or torch.device("cpu"), where)
            self.pin_memory = False  # the batches are built where they are used
        self._loader: DataLoader[Any] | None = None
        self.reservoir: AsyncReservoir | None = None
        if self.config.reservoir is not None and section != "training":
            raise ConfigError.at(
                where(section, "dataloader", "reservoir"),
                f"{section}.dataloader.reservoir",
                "is for training only (a pass that evaluates visits every sample once)",
                "remove it here",
            )
        if reservoir and self.config.reservoir is not None:
            self.reservoir = self._reservoir(config, where)

    def _hold_on(self, device: torch.device, where: Where) -> None:
        """`dataloader.on_device`: the task keeps its data on `device` and gathers each batch
        there (on the host too, so that a config means the same on every machine)."""
        key = where(self.section, "dataloader", "on_device")
        try:
            held = self.task.hold_on(device)
        except torch.OutOfMemoryError as error:
            raise ConfigError.at(
                key,
                f"{self.section}.dataloader.on_device",
                f"the task's data does not fit in the memory of {device} "
                f"({str(error).splitlines()[0]})",
                "remove on_device, or train on a smaller split (task.subset)",
            ) from None
        if not held:
            raise ConfigError([_cannot_hold(self.section, self.task, where)])

    def _reservoir(self, config: SectionConfig, where: Where) -> AsyncReservoir:
        """`dataloader.reservoir` (training only, one process): its workers draw their
        indices from a sampler of their own, one pass over the data per virtual epoch."""
        settings = self.config.reservoir
        assert settings is not None
        key = where(self.section, "dataloader", "reservoir")
        shown = f"{self.section}.dataloader.reservoir"
        if self.world > 1:
            raise ConfigError.at(
                key,
                shown,
                f"cannot be used by {self.world} processes yet (each would need its own "
                "share of the data)",
                "train with one process, or remove the reservoir",
            )
        order_sampler = build_sampler(
            config.sampler,
            len(self.task),
            seed=self.seed,
            shuffle=self.config.shuffle is not False,
            targets=self.task.sample_targets(),
        )

        def order(virtual_epoch: int) -> list[int]:
            order_sampler.set_epoch(virtual_epoch)
            order_sampler.set_start(0)
            return list(order_sampler)

        return AsyncReservoir(
            self.task,
            order,
            size=settings.size,
            replacement_rate=settings.replacement_rate,
            workers=settings.workers,
            seed=self.seed,
            deterministic=settings.deterministic,
            where=where(self.section, "dataloader", "reservoir", "size"),
        )

    def stoppable(self, epoch: int, start_batch: int, signals: StopRequest) -> StopAwareBatches:
        """`epoch()` for a training loop that `signals` can ask to stop: a wait for the
        reservoir's samples ends at once, and a loader failing while a stop is pending ends
        the epoch early (see StopAwareBatches)."""

        def stopping() -> bool:
            return signals.by_signal

        return StopAwareBatches(self.epoch(epoch, start_batch, stopping), stopping)

    def epoch(
        self, epoch: int, start_batch: int = 0, stopping: Callable[[], bool] | None = None
    ) -> Iterable[Any]:
        """The loader for `epoch`, skipping its first `start_batch` batches (resume). With a
        reservoir, the epoch's number of batches drawn from it (a wait for its samples ends
        when `stopping()` is true)."""
        if self.reservoir is not None:
            return ReservoirEpoch(
                self.reservoir,
                self.batches_per_epoch() - min(start_batch, self.batches_per_epoch()),
                self.config.batch_size,
                self._collate_samples,
                pin=self.pin_memory,
                stopping=stopping,
            )
        self.sampler.set_epoch(epoch)
        # A save after the epoch's last batch, shorter than batch_size when the epoch does
        # not divide evenly, resumes at the epoch's end: nothing left to load.
        at_end = start_batch >= self.batches_per_epoch() > 0
        start = self.sampler.epoch_length() if at_end else start_batch * self.config.batch_size
        self.sampler.set_start(start)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        # Persistent workers only help a loader that is reused across epochs.
        if self._loader is None or not self.config.persistent_workers or start_batch:
            # Tested against None, not by `or`: a KeyedDraws with nothing left (resumed at an
            # epoch's end) has length 0, so is false, and the draws would all be 0.
            sampler: Sampler[int] = self.shard if self.world > 1 else self.sampler
            self._loader = DataLoader(
                TaskBatches(self.task, None if self.keyed is None else self.seed),
                batch_size=self.config.batch_size // self.world,
                sampler=sampler if self.keyed is None else self.keyed,
                num_workers=self.config.num_workers,
                # torch types collate_fn as taking a list of samples; with __getitems__ it
                # receives whatever that returns, here the fetched batch.
                collate_fn=cast("Callable[[list[Any]], Any]", self.collate),
                pin_memory=self.pin_memory,
                drop_last=self.config.drop_last and self.world == 1,  # else the shard drops
                persistent_workers=self.config.persistent_workers and self.config.num_workers > 0,
                worker_init_fn=worker_init if self.config.num_workers else None,
                multiprocessing_context=worker_context() if self.config.num_workers else None,
                generator=generator,
            )
        return WorkerBatches(self._loader) if self.config.num_workers else self._loader

    def _collate_samples(self, samples: list[Any]) -> Batch:
        return self.collate(self.task.collate(samples))

    def reservoir_state(self) -> dict[str, Any] | None:
        """The reservoir's state for a checkpoint, in every mode: a deterministic one resumes
        exactly, the other continues its stream (a run preempted and resumed again and
        again would otherwise train on the first samples of its data alone); None without."""
        return None if self.reservoir is None else self.reservoir.state_dict()

    def load_reservoir_state(self, state: dict[str, Any] | None) -> str | None:
        """Continue the reservoir from a checkpoint's state; a note for the run's log when the
        resumed run is not bit-identical to one left alone."""
        if self.reservoir is None:
            return None
        if state is None:  # a checkpoint from before reservoirs' states were saved
            return (
                "the reservoir starts afresh at the beginning of its data: the checkpoint "
                "holds no reservoir state"
            )
        if not self.reservoir.load_state_dict(state):
            return (
                "the reservoir's slots start afresh where its stream stood: a run resumed "
                "with a non-deterministic reservoir is not bit-identical to one left alone "
                "(reservoir.deterministic: true is)"
            )
        return None

    def close(self) -> None:
        """Stop the reservoir's workers, if any (DataLoader workers stop by themselves)."""
        if self.reservoir is not None:
            self.reservoir.close()

    def batches_per_epoch(self) -> int:
        """Global batches an epoch has (each process trains its share of each)."""
        size, batch = self.sampler.epoch_length(), self.config.batch_size
        return size // batch if self.config.drop_last else -(-size // batch)

    def last_batch_size(self, length: int | None = None) -> int:
        """Samples in the epoch's last global batch (of an epoch of `length` samples: by
        default the sampler's current epoch's)."""
        size = self.sampler.epoch_length() if length is None else length
        batch = self.config.batch_size
        return batch if self.config.drop_last or size % batch == 0 else size % batch

    def smallest_last_batch(self) -> int:
        """The smallest last global batch any epoch has (a k-fold epoch's length follows its
        held-out fold)."""
        return min(self.last_batch_size(length) for length in self.sampler.epoch_lengths())


def _cannot_hold(section: str, task: Task, where: Where) -> Problem:
    return Problem(
        where(section, "dataloader", "on_device"),
        f"{section}.dataloader.on_device",
        f"the task ({type(task).__name__}) builds its samples one by one, so it cannot "
        "gather its batches on the device",
        "remove on_device; pin_memory and num_workers speed up a host loader",
    )


def check_on_device(tasks: Mapping[str, Task], sections: Mapping[str, Any], where: Where) -> None:
    """What `loom check` can tell of `dataloader.on_device` before any data is read: a
    section whose task's class holds no tensors at all (text, VQA) is refused. A task that
    can hold them but reads this split from files is refused when the run starts."""
    problems = [
        _cannot_hold(section, task, where)
        for section, task in tasks.items()
        if getattr(getattr(sections.get(section), "dataloader", None), "on_device", False)
        and type(task).tensors_to_hold is Task.tensors_to_hold
    ]
    if problems:
        raise ConfigError(problems)


def to_device(batch: Batch, device: torch.device) -> Batch:
    """Tensors moved once per batch, without blocking the host where the copy allows it."""
    if device.type == "cpu":
        return batch
    return {
        key: value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value
        for key, value in batch.items()
    }


def _no_batch(section: str, samples: int, config: SectionConfig, where: Where) -> Problem:
    """An epoch of `section` that has no batch: what leaves it empty, and what to change."""
    batch = config.dataloader.batch_size
    if samples == 0:
        return Problem(
            where(section, "task"),
            f"{section}.task",
            "gives an epoch no sample (its subset, or the sampler, selects none)",
            "select at least one sample",
        )
    return Problem(
        where(section, "dataloader", "drop_last"),
        f"{section}.dataloader.drop_last",
        f"drops the epoch's only batch: {samples} sample(s) an epoch, fewer than batch_size "
        f"{batch}",
        f"use a batch_size of at most {samples}, or drop_last: false",
    )
