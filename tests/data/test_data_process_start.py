"""Sample-making workers hand their batches over through Unix sockets, whose paths have at
most 107 bytes on Linux: under a deep TMPDIR a loader worker dropped its first batch and the
run waited for it forever. Each case runs in a process of its own: multiprocessing makes its
socket folder once per process."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from torchloom.data.process_start import TEMPORARY_FOLDER_MAX

# The socket folder the worker context leaves this process with and, with "load", a loader
# with one worker over a CPU tensor (its batches travel as file descriptors) with a timeout,
# so that a lost batch fails the test instead of hanging it. Without it, torch stays out.
LOADER = """
import sys
from torchloom.data import process_start
from torchloom.errors import LoomError
if "no-short-folder" in sys.argv:
    process_start.SHORT_TEMPORARY_FOLDERS = ("/nonexistent",)
try:
    context = process_start.worker_context()
except LoomError as error:
    print(error)
    sys.exit(2)
print(process_start.socket_folder())
if "load" in sys.argv:
    import torch
    from torch.utils.data import DataLoader
    loader = DataLoader(torch.arange(6.0), batch_size=3, num_workers=1,
                        multiprocessing_context=context, timeout=60)
    print([batch.tolist() for batch in loader])
"""


def run_loader(tmpdir: Path, *cases: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", LOADER, *cases],
        env={**os.environ, "TMPDIR": str(tmpdir)},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def deep_folder(tmp_path: Path, length: int) -> Path:
    """A folder under tmp_path whose path has `length` characters."""
    name = "d" * (length - len(str(tmp_path)) - 1)
    assert name, "tmp_path is already longer than the folder asked for"
    (tmp_path / name).mkdir()
    return tmp_path / name


def test_a_loader_worker_under_a_temporary_folder_too_deep_for_sockets_delivers() -> None:
    # One byte too many for the sockets under it (what pytest's 100th temporary folder made
    # of the distributed tests' TMPDIR): they go under /tmp, as Python 3.14 puts them.
    with tempfile.TemporaryDirectory(dir="/tmp") as top:
        tmpdir = deep_folder(Path(top), TEMPORARY_FOLDER_MAX + 1)
        done = run_loader(tmpdir, "load")
    assert done.returncode == 0, done.stderr
    folder, batches = done.stdout.splitlines()
    assert batches == "[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]"
    assert Path(folder).parent == Path("/tmp") and "Traceback" not in done.stderr


def test_a_temporary_folder_that_fits_keeps_the_sockets() -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as top:  # tmp_path may be too deep itself
        tmpdir = deep_folder(Path(top), TEMPORARY_FOLDER_MAX)
        done = run_loader(tmpdir)
        assert done.returncode == 0, done.stderr
        assert Path(done.stdout.strip()).parent == tmpdir


def test_no_folder_short_enough_is_a_clear_error_before_any_worker_starts(
    tmp_path: Path,
) -> None:
    done = run_loader(deep_folder(tmp_path, TEMPORARY_FOLDER_MAX + 20), "no-short-folder")
    assert done.returncode == 2, done.stderr
    assert "storage error: multiprocessing's folder" in done.stdout
    assert "is too long for the sockets through which loader and reservoir workers" in done.stdout
    assert f"set TMPDIR to a writable folder of at most {TEMPORARY_FOLDER_MAX} bytes" in done.stdout
