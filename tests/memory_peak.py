"""The peak of Python's allocations in a block (tracemalloc): for the tests that a file of any
size is read in bounded memory, a bound that does not depend on the machine's speed."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def traced_peak() -> Iterator[list[int]]:
    """`with traced_peak() as peak: ...`, then peak[0] is the block's peak, in bytes."""
    measured = [0]
    tracemalloc.start()
    try:
        yield measured
    finally:
        measured[0] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
