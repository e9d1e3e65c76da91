"""The asynchronous reservoir: every sample delivered at least once per virtual epoch,
deterministic in its test mode, never waiting once full, and no worker outliving it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
import torch

from live_processes import alive
from torchloom.data.reservoir import AsyncReservoir, ReservoirError, ReservoirStopped
from torchloom.data.reservoir_workers import sample_seed
from torchloom.errors import ConfigError, DataError


class Augmented:
    """Samples carrying their index and a random 'augmentation' drawn in the worker."""

    def __init__(
        self, size: int, delay: float = 0.0, fail_at: int | None = None, damaged: bool = False
    ) -> None:
        self.size, self.delay, self.fail_at, self.damaged = size, delay, fail_at, damaged

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        if index == self.fail_at and self.damaged:
            raise DataError.at("images.idx:13", f"sample {index}", "is truncated", "download it")
        if index == self.fail_at:
            raise ValueError(f"cannot read sample {index}")
        if self.delay:
            time.sleep(self.delay)
        return {"index": torch.tensor(index), "noise": torch.rand(2)}


def order_of(size: int) -> Any:
    def order(epoch: int) -> list[int]:
        return torch.randperm(size, generator=torch.Generator().manual_seed(epoch)).tolist()

    return order


def collate(samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    return {key: torch.stack([s[key] for s in samples]) for key in samples[0]}


def reservoir(dataset: Any, **settings: Any) -> AsyncReservoir:
    options = {"size": 16, "replacement_rate": 0.25, "workers": 2, "seed": 5, "record": True}
    return AsyncReservoir(dataset, order_of(len(dataset)), **{**options, **settings})


def test_the_deterministic_mode_repeats_itself_and_delivers_every_sample() -> None:
    runs = []
    for _ in range(2):
        source = reservoir(Augmented(50), deterministic=True)
        try:
            batches = [source.next_batch(8, collate) for _ in range(30)]
        finally:
            source.close()
        runs.append((batches, source.deliveries))
        assert source.quota == 4
    (first, deliveries), (second, _) = runs
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a["index"], b["index"]) and torch.equal(a["noise"], b["noise"])
    # 16 samples to fill, 4 new per step after: 16 + 29 * 4 = 132 > 100, two virtual epochs
    assert deliveries is not None
    for epoch in (0, 1):
        assert {index for e, index in deliveries if e == epoch} == set(range(50))


def test_training_draws_without_waiting_and_still_sees_every_sample() -> None:
    source = reservoir(Augmented(40, delay=0.05), replacement_rate=0.5)
    processes = []
    try:
        source.next_batch(8, collate)  # the first batch waits for a full reservoir
        processes = [p.pid for p in source.processes]
        started = time.perf_counter()
        for _ in range(10):
            source.next_batch(8, collate)
        # Waiting for the 8 new samples a step allows would take 10 * 8 * 0.05 / 2 = 2 s.
        assert time.perf_counter() - started < 0.5
        assert source.taken < 16 + 10 * 8  # replacing at most 8 a step; fewer arrived
        while source.virtual_epoch < 2:  # keep drawing until a second pass was handed out
            source.next_batch(8, collate)
            time.sleep(0.01)
        while any(e == 0 for e, _ in source.job_of.values()) or source.fresh:
            source.next_batch(8, collate)  # pass 0's samples not yet taken in or delivered
        deliveries = source.deliveries
        assert deliveries is not None
        assert {index for e, index in deliveries if e == 0} == set(range(40))
    finally:
        source.close()
    assert processes and not any(alive(pid) for pid in processes)


def test_a_failing_sample_is_an_error_with_its_traceback_and_workers_stop() -> None:
    source = reservoir(Augmented(30, fail_at=13), deterministic=True)  # waits for sample 13
    with pytest.raises(ReservoirError, match="failed on sample 13") as error:
        for _ in range(20):
            source.next_batch(8, collate)
    assert "cannot read sample 13" in str(error.value)
    pids = [p.pid for p in source.processes]
    source.close()
    source.close()  # idempotent
    assert not any(alive(pid) for pid in pids)


def test_a_sample_the_user_must_fix_is_their_error_not_a_worker_crash() -> None:
    """A DataError in a worker (a damaged file) reaches training as that DataError, every
    problem intact, so the CLI prints it and exits 2, not a traceback and exit 1."""
    source = reservoir(Augmented(30, fail_at=13, damaged=True), deterministic=True)
    try:
        with pytest.raises(DataError) as error:
            for _ in range(20):
                source.next_batch(8, collate)
    finally:
        source.close()
    assert str(error.value) == ("data error: images.idx:13: sample 13: is truncated (download it)")


def test_the_deterministic_mode_continues_exactly_from_its_state() -> None:
    whole = reservoir(Augmented(50), deterministic=True)
    try:
        expected = [whole.next_batch(8, collate) for _ in range(12)]
    finally:
        whole.close()
    first = reservoir(Augmented(50), deterministic=True)
    try:
        got = [first.next_batch(8, collate) for _ in range(5)]
        state = first.state_dict()
    finally:
        first.close()
    second = reservoir(Augmented(50), deterministic=True)
    try:
        second.load_state_dict(state)
        got += [second.next_batch(8, collate) for _ in range(7)]
    finally:
        second.close()
    for a, b in zip(expected, got, strict=True):
        assert torch.equal(a["index"], b["index"]) and torch.equal(a["noise"], b["noise"])


def test_workers_killed_after_the_fill_end_the_training_with_an_error() -> None:
    """Once full, a step takes in what arrived without waiting, so workers killed then were
    noticed by nobody: training went on drawing the same samples and ended successfully."""
    source = reservoir(Augmented(40))
    try:
        source.next_batch(8, collate)
        for process in source.processes:
            os.kill(process.pid, signal.SIGKILL)
            process.join(timeout=5)
        with pytest.raises(ReservoirError, match="reservoir worker died"):
            source.next_batch(8, collate)
    finally:
        source.close()


def test_a_stop_during_the_fill_ends_it_at_once() -> None:
    """The first batch waits for a full reservoir: a stop signal during that wait waited for
    the whole fill (for ever with a huge size)."""
    source = reservoir(Augmented(40, delay=0.25))  # the fill: 16 * 0.25 / 2 = 2 s
    started = time.monotonic()
    try:
        with pytest.raises(ReservoirStopped, match="stop"):
            source.next_batch(8, collate, stopping=lambda: time.monotonic() > started + 0.3)
        assert time.monotonic() - started < 1.0
    finally:
        source.close()
    assert time.monotonic() - started < 1.6  # the jobs not started are dropped


def test_workers_leave_at_close_even_when_the_drain_of_their_jobs_stops_early() -> None:
    """close() drops the jobs not yet started, but that drain gives up when a worker holds
    the queue's read lock at that instant (it is taking a job): the workers then made every
    job left before their sentinels (here about 116 of 0.25 s between 2) and were killed at
    the 2 s grace's end. Held here by this process while close() runs, as a worker would."""
    import threading

    source = reservoir(Augmented(160, delay=0.25), size=120)
    started = time.monotonic()
    try:
        with pytest.raises(ReservoirStopped):
            source.next_batch(8, collate, stopping=lambda: time.monotonic() > started + 0.3)
        source.jobs._rlock.acquire()  # type: ignore[attr-defined]
        threading.Timer(0.3, source.jobs._rlock.release).start()  # type: ignore[attr-defined]
    finally:
        source.close()
    assert [process.exitcode for process in source.processes] == [0, 0]  # left, not killed


def test_a_reservoir_larger_than_the_memory_available_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Measured on the first sample that arrives, before the fill takes the memory."""
    monkeypatch.setattr("torchloom.host_memory.available_memory", lambda: 2000)
    source = reservoir(Augmented(40), where="cfg.yml:7")
    try:
        with pytest.raises(ConfigError) as error:
            source.next_batch(8, collate)
    finally:
        source.close()
    message = str(error.value)
    assert "cfg.yml:7: training.dataloader.reservoir.size: 16 samples of about" in message
    assert "use a size of at most" in message


ORPHANING = """
import sys, time
from torchloom.data.reservoir import AsyncReservoir

class Slow:
    def __len__(self):
        return 100
    def __getitem__(self, index):
        time.sleep(0.5)
        return index

source = AsyncReservoir(Slow(), lambda epoch: list(range(100)), size=16, replacement_rate=1.0,
                        workers=2, seed=1)
source.start()
source._issue()  # 32 jobs queued: 8 s of work for two workers
print(*(p.pid for p in source.processes), flush=True)
time.sleep(60)
"""


def test_workers_leave_at_once_when_the_main_process_is_killed() -> None:
    """They noticed a dead parent only when their job queue ran dry: every queued job was
    made for nobody first (22 s seen)."""
    main = subprocess.Popen([sys.executable, "-c", ORPHANING], stdout=subprocess.PIPE, text=True)
    try:
        assert main.stdout is not None
        pids = [int(pid) for pid in main.stdout.readline().split()]
        time.sleep(0.3)  # the workers are making their first samples
    finally:
        main.kill()
        main.wait()
    deadline = time.monotonic() + 1.5
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(pids) == 2 and not any(alive(pid) for pid in pids)


def test_seeds_of_samples_runs_and_draws_never_coincide() -> None:
    """Seeds were seed * 1_000_003 + sequence: sequence 1_000_003 + n of one run had the
    augmentation of sequence n of the run seeded one more, and the slot draws' generator
    (sequence 0x5E5E) the seed of sample 24158."""
    assert sample_seed(5, 1_000_003 + 7) != sample_seed(6, 7)
    source = reservoir(Augmented(4))
    assert source.generator.initial_seed() not in {sample_seed(5, n) for n in range(30000)}
    assert len({sample_seed(seed, n) for seed in range(30) for n in range(3000)}) == 30 * 3000


def test_a_deterministic_fill_stopped_midway_resumes_exactly() -> None:
    """A run stopped during the fill saves the reservoir as it stands (some slots filled):
    resumed, it makes the same batches as a run left alone."""
    whole = reservoir(Augmented(40), deterministic=True)
    try:
        expected = [whole.next_batch(8, collate) for _ in range(5)]
    finally:
        whole.close()
    first = reservoir(Augmented(40), deterministic=True)
    try:
        with pytest.raises(ReservoirStopped):
            first.next_batch(8, collate, stopping=lambda: len(first.slots) >= 6)
        state = first.state_dict()
    finally:
        first.close()
    assert len(state["sequences"]) == 6
    second = reservoir(Augmented(40), deterministic=True)
    try:
        second.load_state_dict(state)
        got = [second.next_batch(8, collate, stopping=lambda: False) for _ in range(5)]
    finally:
        second.close()
    for a, b in zip(expected, got, strict=True):
        assert torch.equal(a["index"], b["index"]) and torch.equal(a["noise"], b["noise"])


def test_a_deterministic_state_continues_the_stream_of_a_reservoir_that_is_not() -> None:
    """A run resumed with `deterministic: false` from a deterministic one's last.pt (one
    saved by an older torchloom too, without `stream`) continues its data where it stood."""
    first = reservoir(Augmented(40), deterministic=True, workers=1)
    try:
        for _ in range(3):
            first.next_batch(8, collate)
        state = first.state_dict()
    finally:
        first.close()
    for saved in (state, {k: v for k, v in state.items() if k not in ("stream", "deterministic")}):
        second = reservoir(Augmented(40), workers=1)
        try:
            assert not second.load_state_dict(saved)
            second.next_batch(8, collate)
        finally:
            second.close()
        assert second.deliveries is not None
        assert all(epoch == 0 for epoch, _ in second.deliveries)
        assert [i for _, i in second.deliveries] != order_of(40)(0)[:8]


def test_a_deterministic_step_that_fails_takes_none_of_its_samples_in() -> None:
    """A step cut short (a worker failed or died while a stop was pending: the run then saves
    last.pt and ends interrupted) must leave the reservoir as the last step left it, or the
    resume it promises to be exact is not."""
    failing = order_of(50)(0)[17]  # the second of the second step's four new samples
    source = reservoir(Augmented(50, fail_at=failing), deterministic=True, workers=1)
    try:
        source.next_batch(8, collate)  # the fill: positions 0 to 15
        before = source.state_dict()
        with pytest.raises(ReservoirError, match=f"failed on sample {failing}"):
            source.next_batch(8, collate)
        after = source.state_dict()
    finally:
        source.close()
    assert (after["taken"], after["sequences"], after["fresh"]) == (
        before["taken"],
        before["sequences"],
        before["fresh"],
    )


def test_a_huge_reservoir_issues_a_few_jobs_before_its_memory_is_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """size 10^8 at a replacement rate of 1 queued 2 x 10^8 jobs before the first sample
    came, whose size the memory check needs: gigabytes and minutes, deaf to a stop. A few
    jobs go out first; the check counts the jobs kept in flight too."""
    monkeypatch.setattr("torchloom.host_memory.available_memory", lambda: 8 * 2**30)
    source = reservoir(Augmented(40), size=10**8, replacement_rate=1.0, where="cfg.yml:7")
    try:
        with pytest.raises(ConfigError) as error:
            source.next_batch(8, collate)
        assert source.issued <= 2 * source.workers
    finally:
        source.close()
    assert "with the 200000000 kept in flight" in str(error.value)
