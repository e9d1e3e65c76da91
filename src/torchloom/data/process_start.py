"""How torchloom starts the processes that make samples (loader workers, reservoir workers).

Forked where the platform can fork: a forked worker shares the parent's dataset (nothing is
pickled, nothing copied until written), as a worker of a run started by torchrun is. A
process that the elastic launcher started is itself spawned, and its default start method is
then `spawn`, which pickles the dataset into every worker: a task holds its build context's
closures, which cannot be pickled (`loom train --nproc 2` with `num_workers: 1` died at its
first batch), and a large in-memory dataset would be copied per worker."""

from __future__ import annotations

import multiprocessing
from typing import Any


def worker_context() -> Any:
    """The multiprocessing context sample-making workers start in."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")
