"""Shared test set-up: the toy components in tests/toy_components.py are importable as
`toy_components:Class`, exactly as a third-party component would be named in a config; the
`one_thread` fixture."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op thread for the test: small models on a shared two-core machine only wait
    on a second thread, and one thread makes the floating-point sums, so a training run, the
    same on every machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
