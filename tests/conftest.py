"""Shared test set-up: the toy components in tests/toy_components.py are importable as
`toy_components:Class`, exactly as a third-party component would be named in a config; the
`file_size_limit` and `read_only_folder` fixtures; one torch thread in every test process."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

# cuBLAS takes this setting at a process's first matrix product on a GPU. The suite's runs
# share one process, so a deterministic run's set-up (set_deterministic, which sets it for a
# `loom` process) may come after other tests' products on the GPU: set it before any.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

# `make test` runs one pytest-xdist worker per core: each works with one torch thread, and so
# do the processes its tests start, or the workers' threads take turns on the cores. A test
# run alone does the same, so that it computes what it computes in the suite, whatever the
# environment says: tests compare runs in their own process with runs in processes they start.
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)


@pytest.fixture
def file_size_limit() -> Callable[[int], contextlib.AbstractContextManager[None]]:
    """A context in which no file this process writes may grow past a number of bytes: a
    write past it fails with the OS error EFBIG ("File too large"), a real one for root too
    (for whom chmod stops nothing), in the middle of a file."""

    @contextlib.contextmanager
    def limited(size: int) -> Iterator[None]:
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        # Python ignores SIGXFSZ from the start (the write fails instead): make sure of it.
        previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            signal.signal(signal.SIGXFSZ, previous)

    return limited


@pytest.fixture
def read_only_folder(tmp_path: Path) -> Iterator[Path]:
    """An existing folder in which creating a file fails with EACCES ("Permission denied"):
    a folder of mode 0o555, or, for root (whom no mode stops), /sys/kernel, where the kernel
    refuses every new file."""
    if os.geteuid() == 0:
        yield Path("/sys/kernel")
        return
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        yield folder
    finally:
        folder.chmod(0o755)
