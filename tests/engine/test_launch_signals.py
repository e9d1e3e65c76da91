"""A launched worker whose launcher is gone: asked to stop as by Ctrl-C, then killed if it
cannot (a worker waiting for a batch its loader worker lost outlived a killed `loom train
--nproc 2` for good, with its loader workers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from live_processes import alive

# A worker that takes the stop but cannot act on it (its step never ends), watching its
# launcher with a grace of one second.
WORKER = """
import os, signal, sys, threading, time
from torchloom.engine.launch_signals import stop_when_gone
signal.signal(signal.SIGTERM, lambda *_: print("asked to stop", flush=True))
threading.Thread(target=stop_when_gone, args=(os.getppid(), 1.0), daemon=True).start()
print("watching", flush=True)
time.sleep(600)
"""
LAUNCHER = f"""
import subprocess, sys, time
with open(sys.argv[1], "w") as said:
    worker = subprocess.Popen([sys.executable, "-c", {WORKER!r}], stdout=said)
print(worker.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_worker_that_cannot_stop_is_killed_after_its_launcher_is_killed(
    tmp_path: Path,
) -> None:
    said = tmp_path / "worker.txt"
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(said)], stdout=subprocess.PIPE, text=True
    )
    assert launcher.stdout is not None
    worker = int(launcher.stdout.readline())
    try:
        deadline = time.monotonic() + 60
        while "watching" not in said.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "watching" in said.read_text(), "the worker never started watching"
        launcher.kill()  # kill -9: no chance to stop its worker
        launcher.wait()
        deadline = time.monotonic() + 30
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(worker), "the worker outlived its launcher"
        assert said.read_text().split() == ["watching", "asked", "to", "stop"]
    finally:
        if alive(worker):
            os.kill(worker, signal.SIGKILL)
