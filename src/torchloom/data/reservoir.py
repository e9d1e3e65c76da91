"""An asynchronous reservoir of processed samples (Torch Research Workflows' idea,
SequenceAsyncReservoir): worker processes keep producing processed (augmented) samples, and
training draws its batches from a reservoir of them without waiting for the workers.

    reservoir = AsyncReservoir(task, order, size=512, replacement_rate=0.05, workers=2, seed=7)
    batch = reservoir.next_batch(64, collate)   # never waits once the reservoir is full
    reservoir.close()                           # also when the run fails or is interrupted

How it works. The main process hands out jobs (a sequence number and a dataset index), in
the order `order(virtual_epoch)` gives for each pass over the data (a *virtual epoch*), and
keeps at most `prefetch` jobs outstanding, so idle workers cost nothing. Workers fetch
`dataset[index]` (augmentations included), seeded from (seed, sequence number) so a sample's
content does not depend on which worker made it, and send it back. Each step at most
`replacement_rate * size` new samples enter the reservoir, each replacing a sample that was
already delivered; a batch takes the samples not yet delivered first (oldest first) and fills
up with random delivered ones. So every sample of a virtual epoch is delivered at least once,
and when augmentation is slower than training, samples are reused instead of waited for.

`deterministic`: each step takes in exactly its quota of new samples, in sequence order,
waiting for them if need be: a run then depends on the seed only (tests, comparisons).

Shutdown never hangs: workers ignore SIGINT, SIGTERM and SIGHUP (the main process stops
them), leave when the main process dies, and `close()` stops them with a deadline and then
kills them; it runs at garbage collection and interpreter exit too.
"""

from __future__ import annotations

import os
import pickle
import queue
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchloom.data.process_start import worker_context
from torchloom.data.reservoir_workers import POLL, derived_seed, stop_workers, work
from torchloom.errors import ConfigError
from torchloom.host_memory import short_of_memory

Sample = Any


class ReservoirError(RuntimeError):
    """A worker failed (its traceback is in the message) or died."""


class ReservoirStopped(ReservoirError):
    """A wait for samples (the fill) ended by a stop request (`next_batch`'s `stopping`)."""


# What one job in flight costs besides its sample: its message in the queue and its entry in
# the bookkeeping (job_of, waiting), roughly.
JOB_BYTES = 256


def _mib(size: int) -> str:
    return f"{size / 2**20:.3g} MiB"


class AsyncReservoir:
    def __init__(
        self,
        dataset: Any,
        order: Callable[[int], Sequence[int]],
        *,
        size: int,
        replacement_rate: float,
        workers: int,
        seed: int,
        deterministic: bool = False,
        record: bool = False,
        where: str = "",
    ) -> None:
        """`dataset[index]` gives a processed sample (it is copied into each worker);
        `order(virtual_epoch)` the indices of one pass over the data; `where` the config's
        place of `size`, for an error that names it."""
        self.dataset, self.order, self.where = dataset, order, where
        self.sample_bytes: int | None = None  # the first sample's, for the memory estimate
        self.size, self.workers, self.seed = size, workers, seed
        self.deterministic = deterministic
        self.quota = max(1, int(replacement_rate * size))  # new samples per step, at most
        self.prefetch = max(2 * self.quota, 2 * workers)
        self.slots: list[Sample] = []  # the reservoir
        self.origins: list[tuple[int, int]] = []  # each slot's (virtual epoch, index)
        self.fresh: deque[int] = deque()  # slots not yet delivered, oldest first
        self.stale: list[int] = []  # slots delivered at least once (replaceable)
        self.waiting: dict[int, tuple[int, Sample]] = {}  # arrived, not yet taken in
        self.sequences: list[int] = []  # each slot's sequence number (its augmentation seed)
        self.positions: list[tuple[int, int]] = []  # each slot's (virtual epoch, position)
        self.job_of: dict[int, tuple[int, int]] = {}  # (virtual epoch, position) of jobs out
        self.refill: dict[int, int] = {}  # after load_state_dict: sequence -> slot to remake
        self.issued = 0  # jobs handed out
        self.taken = 0  # samples taken into the reservoir (deterministic: in order)
        self.virtual_epoch, self.position, self.current = 0, 0, list(order(0))
        self.steps = self.fresh_delivered = 0  # batches drawn; never-delivered samples in them
        # (virtual epoch, index) of every sample of every batch, when asked for (tests)
        self.deliveries: list[tuple[int, int]] | None = [] if record else None
        self.generator = torch.Generator().manual_seed(derived_seed(seed, "draws"))
        self.processes: list[Any] = []
        self._finalizer: Any = None
        self.stopping: Callable[[], bool] | None = None  # next_batch's: a stop is asked

    # ---- workers ---------------------------------------------------------------------------
    def start(self) -> None:
        if self.processes:
            return
        context = worker_context()
        self.jobs, self.results = context.Queue(), context.Queue()
        closing = context.RawValue("b", 0)  # set at close; lock-free (see stop_workers)
        for number in range(self.workers):
            process = context.Process(
                target=work,
                args=(self.dataset, self.seed, self.jobs, self.results, os.getpid(), closing),
                name=f"torchloom-reservoir-{number}",
                daemon=True,
            )
            process.start()
            self.processes.append(process)
        self._finalizer = weakref.finalize(
            self, stop_workers, self.processes, self.jobs, self.results, closing
        )

    def close(self) -> None:
        """Stop the workers (idempotent; also at garbage collection and exit)."""
        if self._finalizer is not None:
            self._finalizer()

    @property
    def alive(self) -> bool:
        return bool(self.processes) and self._finalizer is not None and self._finalizer.alive

    def _issue(self) -> None:
        # Before the first sample, whose size the memory check needs, a few jobs only: a
        # size of 10^8 at a replacement rate of 1 queued 2 x 10^8 jobs first (gigabytes of
        # bookkeeping, minutes deaf to a stop, before the check that refuses it could run).
        ahead = self.prefetch if self.sample_bytes is not None else 2 * self.workers
        while self.issued - self.taken < ahead:  # in workers or arrived, not taken
            if self.position == len(self.current):
                self.virtual_epoch += 1
                self.current, self.position = list(self.order(self.virtual_epoch)), 0
                if not self.current:
                    raise ReservoirError("the sampler's order for a virtual epoch is empty")
            self.jobs.put((self.issued, self.current[self.position]))
            self.job_of[self.issued] = (self.virtual_epoch, self.position)
            self.issued, self.position = self.issued + 1, self.position + 1

    def _receive(self, block: bool) -> bool:
        """One result into `waiting`; False when none came (not blocking, or a poll passed)."""
        try:
            sequence, index, sample, failure = self.results.get(block, POLL if block else None)
        except queue.Empty:
            if block:
                self._check_workers()
                self._check_stop()
            return False
        if isinstance(failure, tuple):
            kind, problems = failure
            raise kind(problems)
        if failure is not None:
            raise ReservoirError(f"a reservoir worker failed on sample {index}:\n{failure}")
        if self.sample_bytes is None:
            self.sample_bytes = len(sample)
            self._check_memory(len(sample))
        self.waiting[sequence] = (index, pickle.loads(sample))
        return True

    def _check_memory(self, sample_bytes: int) -> None:
        """The reservoir's memory, estimated from its first sample, against the memory the
        machine has left: a size that cannot fit is refused before the fill takes it (half
        at most: the training needs its own)."""
        # The slots, and the jobs kept in flight (queued, arrived, each with its bookkeeping).
        per_sample = sample_bytes + JOB_BYTES * self.prefetch // self.size
        need = per_sample * self.size
        available = short_of_memory(need)
        if available is None:
            return
        raise ConfigError.at(
            self.where,
            "training.dataloader.reservoir.size",
            f"{self.size} samples of about {_mib(sample_bytes)} each, with the "
            f"{self.prefetch} kept in flight, need about {_mib(need)}, more than half of the "
            f"{_mib(available)} of memory available",
            f"use a size of at most {max(1, available // 2 // per_sample)}",
        )

    def _check_workers(self) -> None:
        # A worker killed (the OOM killer, kill -9) sends nothing; a waitpid per worker.
        dead = [process for process in self.processes if not process.is_alive()]
        if dead:
            codes = ", ".join(f"{p.name}: exit code {p.exitcode}" for p in dead)
            raise ReservoirError(f"a reservoir worker died ({codes}; killed, or out of memory?)")

    def _check_stop(self) -> None:
        # The fill (or the remaking of the slots on resume) waits for `size` samples, and a
        # run asked to stop must not wait for it. Only then: a deterministic step's take,
        # cut short, would leave a state between two steps that no resume repeats exactly,
        # and it waits for one step's quota alone.
        filling = len(self.slots) < self.size or bool(self.refill)
        if filling and self.stopping is not None and self.stopping():
            raise ReservoirStopped("the reservoir's wait for samples was stopped by a signal")

    # ---- the reservoir ---------------------------------------------------------------------
    def _take(self, count: int, block: bool) -> None:
        """Take up to `count` arrived samples in (deterministic: exactly `count`, in sequence
        order, waiting for them), into empty slots first, then over delivered ones; never
        over a sample not yet delivered."""
        if self.deterministic and len(self.slots) == self.size:
            self._await_in_order(count)
        taken = 0
        while taken < count and (len(self.slots) < self.size or self.stale):
            if block:
                self._check_stop()
            self._issue()
            sequence = self._next_arrival(block)
            if sequence is None:
                break
            index, sample = self.waiting.pop(sequence)
            self._place(sequence, index, sample)
            self.taken, taken = self.taken + 1, taken + 1
        self._issue()

    def _await_in_order(self, count: int) -> None:
        """A deterministic step's new samples, every one arrived before any is taken in: a
        step cut short (a worker failed or died while a stop was pending, and the run saves
        last.pt) then leaves the reservoir as the last step left it, which a resume repeats
        exactly. (The fill may stop midway: it takes its samples in order, nothing else.)"""
        self._issue()  # at least a step's quota of jobs out (prefetch >= quota)
        wanted = range(self.taken, min(self.taken + count, self.issued))
        while any(sequence not in self.waiting for sequence in wanted):
            self._receive(block=True)

    def _next_arrival(self, block: bool) -> int | None:
        if self.deterministic:
            while self.taken not in self.waiting:  # in order: the next sequence number
                self._receive(block=True)
            return self.taken
        while self._receive(block=False):  # whatever arrived meanwhile
            pass
        while block and not self.waiting:
            self._receive(block=True)
        return min(self.waiting) if self.waiting else None

    def _place(self, sequence: int, index: int, sample: Sample) -> None:
        if len(self.slots) < self.size:
            self.slots.append(sample)
            self.origins.append((0, 0))
            self.positions.append((0, 0))
            self.sequences.append(sequence)
            slot = len(self.slots) - 1
        else:
            pick = int(torch.randint(len(self.stale), (1,), generator=self.generator))
            slot = self.stale[pick]
            self.stale[pick] = self.stale[-1]
            self.stale.pop()
            self.slots[slot], self.sequences[slot] = sample, sequence
        self.positions[slot] = self.job_of.pop(sequence)
        self.origins[slot] = (self.positions[slot][0], index)
        self.fresh.append(slot)

    def next_batch(
        self,
        batch_size: int,
        collate: Callable[[list[Sample]], Any],
        stopping: Callable[[], bool] | None = None,
    ) -> Any:
        """A batch of `batch_size` samples (at most `size`): the first call waits until the
        reservoir is full; later ones take in what arrived (up to the step's quota) and
        never wait, unless `deterministic`. The fill ends with ReservoirStopped as soon as
        `stopping()` is true (polled every sample and every fraction of a second)."""
        if batch_size > self.size:
            raise ValueError(f"a batch of {batch_size} exceeds the reservoir's {self.size}")
        self.stopping = stopping
        self.start()
        # Every step: once full, a step takes in only what arrived, without waiting, so dead
        # workers would otherwise leave training drawing the same samples to its end.
        self._check_workers()
        if self.refill:
            self._remake()
        if len(self.slots) < self.size:
            self._take(self.size - len(self.slots), block=True)
        else:
            self._take(self.quota, block=self.deterministic)
        fresh = [self.fresh.popleft() for _ in range(min(batch_size, len(self.fresh)))]
        chosen = list(fresh)
        if len(chosen) < batch_size:  # every fresh sample is in: fill up with delivered ones
            picks = torch.randperm(len(self.stale), generator=self.generator)
            chosen += [self.stale[int(i)] for i in picks[: batch_size - len(chosen)]]
        self.stale.extend(fresh)  # delivered now: replaceable
        self.steps, self.fresh_delivered = self.steps + 1, self.fresh_delivered + len(fresh)
        if self.deliveries is not None:
            self.deliveries.extend(self.origins[slot] for slot in chosen)
        return collate([self.slots[slot] for slot in chosen])

    # ---- resume ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the reservoir stands: which sample (sequence number, index) each slot holds,
        which are not yet delivered, the draws' generator and the next job; and where its
        stream stands (`stream`). Samples are not saved: they are made again from (seed,
        sequence number), so this is exact only in the deterministic mode, where what
        arrives when does not matter; the other mode continues the stream."""
        following = self.job_of.get(self.taken, (self.virtual_epoch, self.position))
        return {
            "deterministic": self.deterministic,
            "stream": list(self._stream_point()),
            "taken": self.taken,
            "next": list(following),
            "sequences": list(self.sequences),
            "positions": [list(position) for position in self.positions],
            "origins": [list(origin) for origin in self.origins],
            "fresh": list(self.fresh),
            "stale": list(self.stale),
            "generator": self.generator.get_state(),
            "steps": self.steps,
            "fresh_delivered": self.fresh_delivered,
        }

    def _stream_point(self) -> tuple[int, int, int]:
        """(sequence number, virtual epoch, position) of the oldest sample not yet delivered:
        a slot's, or a job's not yet taken in; the next job's when there is none. A stream
        continued from there skips no sample (a later one already delivered, arrived out of
        order, is delivered again)."""
        pending = [(sequence, *job) for sequence, job in self.job_of.items()]
        pending += [(self.sequences[slot], *self.positions[slot]) for slot in self.fresh]
        return min(pending, default=(self.issued, self.virtual_epoch, self.position))

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Continue from `state_dict()`, on a reservoir that has drawn nothing yet. True when
        exact (the deterministic mode, from a deterministic state): the slots' samples are
        made again by the workers at the next batch. Otherwise the stream continues where it
        stood, into empty slots (a sequence number is a sample's seed: kept, not reused)."""
        self.generator.set_state(state["generator"])
        self.steps, self.fresh_delivered = state["steps"], state["fresh_delivered"]
        if not (self.deterministic and state.get("deterministic", True)):
            # A deterministic state saved before `stream` was: its next job's place.
            stream = state.get("stream") or [state["taken"], *state["next"]]
            sequence, self.virtual_epoch, self.position = stream
            self.taken = self.issued = sequence
            self.current = list(self.order(self.virtual_epoch))
            return False
        self.taken = self.issued = state["taken"]
        self.virtual_epoch, self.position = state["next"]
        self.current = list(self.order(self.virtual_epoch))
        self.sequences = list(state["sequences"])
        self.origins = [(int(e), int(i)) for e, i in state["origins"]]
        # A state saved before positions were: the next job's stands in for them.
        default = [state["next"]] * len(self.origins)
        self.positions = [(int(e), int(p)) for e, p in state.get("positions", default)]
        self.slots = [None] * len(self.sequences)
        self.fresh, self.stale = deque(state["fresh"]), list(state["stale"])
        self.job_of, self.waiting = {}, {}
        self.refill = {sequence: slot for slot, sequence in enumerate(self.sequences)}
        return True

    def _remake(self) -> None:
        for sequence, slot in self.refill.items():
            self.jobs.put((sequence, self.origins[slot][1]))
        while self.refill:
            self._receive(block=True)
            for sequence in [s for s in self.waiting if s in self.refill]:
                self.slots[self.refill.pop(sequence)] = self.waiting.pop(sequence)[1]
