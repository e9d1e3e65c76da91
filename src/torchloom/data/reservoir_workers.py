"""The worker side of the asynchronous reservoir (data/reservoir.py): the processes that make
samples for jobs, how a sample travels back, and how they are stopped."""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import queue
import random
import signal
import traceback
from typing import Any

import numpy as np
import torch

from torchloom.errors import LoomError
from torchloom.signals import set_parent_death_signal

POLL = 0.2  # seconds between liveness checks while waiting


def derived_seed(seed: int, purpose: str, number: int = 0) -> int:
    """A seed for one `purpose` ("sample", "draws") and number, from the run's seed: hashed,
    so no two (seed, purpose, number) share one, as seed * K + number did (sequence K + n of
    a run had sequence n's augmentation of the run seeded one more)."""
    digest = hashlib.blake2b(f"{seed}:{purpose}:{number}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % 2**63


def sample_seed(seed: int, sequence: int) -> int:
    """The seed of the augmentation of the sample with this sequence number."""
    return derived_seed(seed, "sample", sequence)


def _compact(value: Any) -> Any:
    """A sample as it travels to the main process: a tensor that views a larger storage (a
    row of a data set held in one tensor) would be pickled with the whole storage."""
    if isinstance(value, torch.Tensor):
        whole = value.untyped_storage().nbytes()
        return value.clone() if whole > value.numel() * value.element_size() else value
    if isinstance(value, dict):
        return {key: _compact(item) for key, item in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_compact(item) for item in value)
    return value


def _packed(sample: Any) -> bytes:
    """A sample as bytes, tensors by value. Not through torch's shared-memory pickling: each
    tensor would cost a round trip to a helper thread of this worker, which waits for the
    GIL while the worker augments (milliseconds a tensor, on the training's side)."""
    return pickle.dumps(_compact(sample), protocol=pickle.HIGHEST_PROTOCOL)


def work(dataset: Any, seed: int, jobs: Any, results: Any, parent: int, closing: Any) -> None:
    """A worker: fetch samples for jobs until told to stop (`closing`, a shared byte set to
    1, or a None job) or the parent is gone."""
    # Stop signals are the main process's to handle: Ctrl-C reaches a terminal's whole
    # process group, and SIGTERM a scheduler's (Slurm's scancel, systemd), and a worker that
    # died of one would fail a run that was asked to stop gracefully. The main process stops
    # the workers (close(), with a SIGKILL after its grace period).
    for signum in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if signum is not None:
            signal.signal(signum, signal.SIG_IGN)
    # A killed main process (SIGKILL, the OOM killer) cannot stop its workers, and a worker
    # would otherwise make every job still queued for nobody: the kernel kills it with its
    # parent (Linux; the parent is the thread that started it, the run's main thread), and
    # elsewhere it asks before each job.
    set_parent_death_signal(signal.SIGKILL)
    torch.set_num_threads(1)
    results.cancel_join_thread()  # exit at once even when nobody reads what is queued
    while True:
        if os.getppid() != parent:  # also a parent that died before the line above
            return
        try:
            job = jobs.get(timeout=POLL)
        except queue.Empty:
            continue
        if job is None or closing.value:
            return
        sequence, index = job
        try:
            value = sample_seed(seed, sequence)
            torch.manual_seed(value)
            random.seed(value)
            np.random.seed(value % 2**32)
            results.put((sequence, index, _packed(dataset[index]), None))
        except LoomError as error:  # the user's to fix: its problems, raised again in training
            results.put((sequence, index, None, (type(error), error.problems)))
        except Exception:
            results.put((sequence, index, None, traceback.format_exc()))


def stop_workers(processes: list[Any], jobs: Any, results: Any, closing: Any) -> None:
    """Stop the workers: `closing` set, a sentinel each, a short grace, then kill (they
    ignore SIGTERM); never blocks long."""
    # A worker takes no job once `closing` is set. The jobs not yet started are dropped too,
    # so that the sentinels come first, but that drain stops early when a worker holds the
    # queue's read lock at that instant (it is taking a job): the workers would then make
    # every job left before their sentinels, and be killed at the grace's end instead. A
    # flag without a lock: an Event's lock held by a worker that was killed would hang here.
    closing.value = 1
    with contextlib.suppress(Exception):
        while True:
            jobs.get_nowait()
    for _ in processes:
        try:
            jobs.put_nowait(None)
        except Exception:
            break
    for process in processes:
        process.join(timeout=2.0)
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join()
    for channel in (jobs, results):
        channel.cancel_join_thread()
        channel.close()
