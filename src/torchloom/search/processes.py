"""The workers of a search: worker 0 in this process and, with --workers K, K - 1 processes
sharing the study; how Ctrl-C, SIGTERM and SIGHUP stop them all, and how a worker stops when
the `loom search` that started it is gone."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from torchloom.search.record import SearchRecord, read_record
from torchloom.search.worker import Say, work


def run_workers(
    search_dir: Path,
    record: SearchRecord,
    workers: int,
    hook_factory: Any = None,
    say: Say = print,
) -> int:
    """Run the study's remaining trials with `workers` processes; returns 130 when stopped by
    Ctrl-C / SIGTERM / SIGHUP (the study keeps what finished; `--resume` continues), else the
    first worker's non-zero exit status (a crashed worker), else 0."""
    timeout = record.settings.get("timeout")
    deadline = time.time() + float(timeout) if timeout else None
    with _hangup_stops():
        if workers <= 1:
            try:
                work(search_dir, record, hook_factory, say, deadline)
            except KeyboardInterrupt:
                return 130
            return 0
        return _run_processes(search_dir, record, workers, hook_factory, say, deadline)


def _run_processes(
    search_dir: Path,
    record: SearchRecord,
    workers: int,
    hook_factory: Any,
    say: Say,
    deadline: float | None,
) -> int:
    """Worker 0 in this process and the others each in a process of their own: a process
    start-up (torch's import, the data read again) is seconds of a core, which --workers K
    on K cores would otherwise take from the trials."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # one torch thread per worker unless told otherwise
    env.setdefault("MKL_NUM_THREADS", env["OMP_NUM_THREADS"])
    env[PARENT_ENV] = str(os.getpid())  # a worker stops when this process is gone
    command = [sys.executable, "-m", "torchloom.cli.main", "search", "--worker", str(search_dir)]
    if deadline is not None:
        command += ["--deadline", str(deadline)]
    # Sessions of their own: a Ctrl-C at the terminal reaches this process alone, which hands
    # each worker exactly one SIGINT (a second one would stop its run at once, unsaved).
    processes: list[subprocess.Popen[bytes]] = []
    codes: list[int] = []
    try:
        try:
            for index in range(1, workers):
                processes.append(
                    subprocess.Popen(
                        [*command, "--worker-index", str(index)], env=env, start_new_session=True
                    )
                )
            with _torch_threads(env["OMP_NUM_THREADS"]):  # as many as each other worker
                work(search_dir, record, hook_factory, say, deadline, worker=0)
            codes = [process.wait() for process in processes]
        except KeyboardInterrupt:
            for process in processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGINT)
            # Each fails its trial, queues it again and exits; a second Ctrl-C ends the wait
            # (the finally below stops whoever is left).
            _wait_all(processes, STOP_GRACE_SECONDS)
            return 130
    finally:
        _stop_all(processes)
    return worker_status(codes)


@contextlib.contextmanager
def _torch_threads(setting: str) -> Iterator[None]:
    """torch's intra-op threads set to `setting` (OMP_NUM_THREADS's value) for a block, then
    back: the API's caller keeps its own."""
    import torch

    previous = torch.get_num_threads()
    if setting.isdigit() and int(setting) > 0:
        torch.set_num_threads(int(setting))
    try:
        yield
    finally:
        torch.set_num_threads(previous)


PARENT_ENV = "TORCHLOOM_SEARCH_PARENT"
STOP_GRACE_SECONDS = 120.0  # for a worker to end its trial after Ctrl-C before SIGTERM


def worker_status(codes: Sequence[int]) -> int:
    """The search's exit status from its workers': 130 when one was interrupted, else the
    first non-zero one (a signal's as the shell shows it, 128 + N), else 0."""
    shown = [128 - code if code < 0 else code for code in codes]
    if 130 in shown:
        return 130
    return next((code for code in shown if code != 0), 0)


def _wait_all(processes: Sequence[subprocess.Popen[bytes]], seconds: float) -> None:
    end = time.monotonic() + seconds
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, end - time.monotonic()))


def _stop_all(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM the workers still running (a second Ctrl-C, an error here), then SIGKILL
    those that outlive a short grace: no worker outlives `loom search`."""
    alive = [p for p in processes if p.poll() is None]
    if not alive:
        return
    with _ignoring_interrupts():
        for process in alive:
            with contextlib.suppress(OSError):
                process.terminate()
        _wait_all(alive, 10.0)
        for process in alive:
            if process.poll() is None:
                with contextlib.suppress(OSError):
                    process.kill()
                process.wait()


@contextlib.contextmanager
def _ignoring_interrupts() -> Iterator[None]:
    """While the workers are being stopped, a further Ctrl-C must not abandon them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _hang_up(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # a closed terminal or SSH session stops the search as Ctrl-C


@contextlib.contextmanager
def _hangup_stops() -> Iterator[None]:
    """SIGHUP stops a search as SIGTERM and Ctrl-C do: its workers stopped, its trials
    queued again (by default it would kill this process and leave the workers running).
    SIGINT stops it even when the search started with SIGINT ignored (a script's background
    job inherits that, and Python then installs no handler): as `loom train` stops."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGHUP, _hang_up)
    previous_interrupt = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous_interrupt)
        signal.signal(signal.SIGHUP, previous)


def continue_worker(
    search_dir: Path, deadline: float | None, hook_factory: Any, index: int = 0
) -> int:
    """One worker process of `--workers K` (the hidden `loom search --worker DIR`): it stops
    as on Ctrl-C when the `loom search` that started it is gone."""
    parent = int(os.environ.get(PARENT_ENV, "0") or 0)
    if parent:
        stop_with_parent(parent)
    record = read_record(search_dir)
    try:
        work(
            search_dir,
            record,
            hook_factory,
            print,
            deadline,
            worker=index,
            orphaned=(lambda: os.getppid() != parent) if parent else None,
        )
    except KeyboardInterrupt:
        return 130
    return 0


def stop_with_parent(parent: int) -> None:
    """Ask Linux for a SIGTERM when the parent goes (SIGKILL included); then check it is
    still there, as it may have gone before. Elsewhere the worker loop checks its parent."""
    if sys.platform.startswith("linux"):
        import ctypes
        import ctypes.util

        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        raise KeyboardInterrupt
