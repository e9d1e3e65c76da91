"""DataLoaders for a section: the task as dataset (fetching whole batches), a resumable
sampler, renaming collate.

Every loader gets its own generator seeded from (seed, epoch), and the sampler's order is a
function of (seed, epoch) too, so the data a run sees never depends on how much of the global
RNG earlier code consumed — the basis of exact resume.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch.utils.data import DataLoader, Dataset

from torchloom.config.schema import SectionConfig
from torchloom.core.component import Batch, Task
from torchloom.data.samplers import RankShard, ResumableSampler, build_sampler
from torchloom.engine.checkpoint import worker_init
from torchloom.errors import ConfigError, Where


class TaskBatches(Dataset[Batch]):
    """The task as torch's DataLoader sees it. The loader hands each batch's indices to
    `__getitems__` at once, so `Task.fetch` can build the batch in one go; `__getitem__`
    stays for code that reads single samples."""

    def __init__(self, task: Task) -> None:
        self.task = task

    def __len__(self) -> int:
        return len(self.task)

    def __getitem__(self, index: int) -> Batch:
        return self.task[index]

    def __getitems__(self, indices: list[int]) -> Batch:
        return self.task.fetch(indices)


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
        pin_memory: bool = False,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        """`rank`/`world`: this process's share of every global batch of `batch_size` (see
        RankShard); the config's batch size must divide among the processes."""
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
        self.collate = RenamingCollate(task)
        self.pin_memory = pin_memory or self.config.pin_memory
        self._loader: DataLoader[Any] | None = None

    def epoch(self, epoch: int, start_batch: int = 0) -> DataLoader[Any]:
        """The loader for `epoch`, skipping its first `start_batch` batches (resume)."""
        self.sampler.set_epoch(epoch)
        # A save after the epoch's last batch, shorter than batch_size when the epoch does
        # not divide evenly, resumes at the epoch's end: nothing left to load.
        at_end = start_batch >= self.batches_per_epoch() > 0
        start = self.sampler.epoch_length() if at_end else start_batch * self.config.batch_size
        self.sampler.set_start(start)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        # Persistent workers only help a loader that is reused across epochs.
        if self._loader is None or not self.config.persistent_workers or start_batch:
            self._loader = DataLoader(
                TaskBatches(self.task),
                batch_size=self.config.batch_size // self.world,
                sampler=self.shard if self.world > 1 else self.sampler,
                num_workers=self.config.num_workers,
                # torch types collate_fn as taking a list of samples; with __getitems__ it
                # receives whatever that returns, here the fetched batch.
                collate_fn=cast("Callable[[list[Any]], Any]", self.collate),
                pin_memory=self.pin_memory,
                drop_last=self.config.drop_last and self.world == 1,  # else the shard drops
                persistent_workers=self.config.persistent_workers and self.config.num_workers > 0,
                worker_init_fn=worker_init if self.config.num_workers else None,
                generator=generator,
            )
        return self._loader

    def batches_per_epoch(self) -> int:
        """Global batches an epoch has (each process trains its share of each)."""
        size, batch = self.sampler.epoch_length(), self.config.batch_size
        return size // batch if self.config.drop_last else -(-size // batch)

    def last_batch_size(self) -> int:
        """Samples in the epoch's last global batch."""
        size, batch = self.sampler.epoch_length(), self.config.batch_size
        return batch if self.config.drop_last or size % batch == 0 else size % batch


def to_device(batch: Batch, device: torch.device) -> Batch:
    """Tensors moved once per batch, without blocking the host where the copy allows it."""
    if device.type == "cpu":
        return batch
    return {
        key: value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value
        for key, value in batch.items()
    }
