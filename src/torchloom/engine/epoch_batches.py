"""How an epoch's batches reach the training loop besides a DataLoader: drawn from an
asynchronous reservoir (ReservoirEpoch), ending early, without an error, when the loader
fails while a stop signal is pending (StopAwareBatches), and from a DataLoader whose workers
stop with an epoch that ends by an error (WorkerBatches)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import torch

from torchloom.core.component import Batch
from torchloom.data.reservoir import AsyncReservoir


class ReservoirEpoch:
    """An epoch's batches drawn from a reservoir (as many as the sampler's epoch has)."""

    def __init__(
        self,
        reservoir: AsyncReservoir,
        batches: int,
        batch_size: int,
        collate: Callable[[list[Any]], Batch],
        pin: bool = False,
        stopping: Callable[[], bool] | None = None,
    ) -> None:
        self.reservoir, self.batches, self.batch_size = reservoir, batches, batch_size
        self.collate, self.pin, self.stopping = collate, pin, stopping

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[Batch]:
        for _ in range(self.batches):
            batch = self.reservoir.next_batch(self.batch_size, self.collate, self.stopping)
            # Pinned, as a DataLoader's with pin_memory: a copy to a GPU from pageable
            # memory waits for the GPU's queue, which is what the reservoir is for avoiding.
            if self.pin:
                batch = {k: v.pin_memory() if torch.is_tensor(v) else v for k, v in batch.items()}
            yield batch


class WorkerBatches:
    """A DataLoader's epoch whose loader workers are stopped when the epoch ends by an error
    (one raised in a worker included). The error keeps the loader's iterator alive (its
    traceback's frames hold it), so torch's own clean-up at the iterator's end never ran:
    the workers, which leave stop signals to the run, outlived the run's end, and the
    interpreter's exit waited for them for ever (the error printed, the command never
    ended). A consumer that stops early (no error) keeps persistent workers for the next
    epoch."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Batch]:
        iterator = None
        try:
            iterator = iter(self.loader)
            yield from iterator
        except (Exception, KeyboardInterrupt):
            # What the iterator's end runs (torch's `__del__`): its workers told to stop and
            # joined for a few seconds. torch then sends SIGTERM, which ours ignore (see
            # worker_init): one stuck in a task's code (the second Ctrl-C's case) is killed.
            stop = getattr(iterator, "_shutdown_workers", None)
            if stop is not None:
                stop()
            for worker in getattr(iterator, "_workers", []):
                if worker.is_alive():
                    worker.kill()
                    worker.join()
            if getattr(self.loader, "_iterator", None) is iterator:  # persistent workers
                self.loader._iterator = None  # the next epoch starts new ones
            raise


class StopRequest(Protocol):
    """Whether a stop signal asked the run to stop (engine/state.py's StopSignals)."""

    @property
    def by_signal(self) -> bool: ...


class StopAwareBatches:
    """A loader's batches that end early, without an error, when fetching one fails while a
    stop signal is pending (`stopping()`): a signal sent to the whole process group (a
    scheduler's SIGTERM) may reach the loader's workers too, and a run asked to stop must
    end `interrupted` with the last finished step saved, not `failed`. `cut_short` says
    whether that happened."""

    def __init__(self, batches: Iterable[Batch], stopping: Callable[[], bool]) -> None:
        self.batches, self.stopping, self.cut_short = batches, stopping, False

    def __iter__(self) -> Iterator[Batch]:
        iterator = iter(self.batches)
        while True:
            try:
                batch = next(iterator)
            except StopIteration:
                return
            except Exception:
                if not self.stopping():
                    raise
                self.cut_short = True
                return
            yield batch
