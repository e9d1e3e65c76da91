"""The workers of a search: worker 0 in this process and, with --workers K, K - 1 processes
sharing the study; how Ctrl-C, SIGTERM and SIGHUP stop them all, and how a worker stops when
the `loom search` that started it is gone.

This module imports neither torch nor the trial machinery at its top (the worker loop loads
in the functions that run it): `loom search` starts its worker processes before it imports
torch itself, so that their start-up overlaps its own."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchloom.config.interpolation import ascii_digits
from torchloom.search.record import SearchRecord, read_record
from torchloom.signals import set_parent_death_signal, stopping_on_signals

if TYPE_CHECKING:
    from torchloom.search.worker import Say


class WorkerProcesses:
    """Workers 1 to K - 1 of `--workers K`, each a process of its own. They may start before
    the search folder exists: a worker's start-up (importing torch, and Dynamo, which every
    optimizer imports: about 3 s of a core) then runs beside this process's own instead of
    taking a core from the trials. Until `begin` names the search folder they wait on their
    stdin; a search that never begins (a bad config) closes it and they exit at once."""

    def __init__(self, count: int) -> None:
        self.env = dict(os.environ)
        self.env.setdefault("OMP_NUM_THREADS", "1")  # one torch thread each unless told
        self.env.setdefault("MKL_NUM_THREADS", self.env["OMP_NUM_THREADS"])
        self.env[PARENT_ENV] = str(os.getpid())  # a worker stops when this process is gone
        command = [sys.executable, "-m", "torchloom.cli.main", "search", "--worker"]
        # Sessions of their own: a Ctrl-C at the terminal reaches this process alone, which
        # hands each worker exactly one SIGINT (a second would stop its run at once, unsaved).
        self.processes: list[subprocess.Popen[bytes]] = []
        self.told = False
        try:
            for index in range(1, count + 1):
                self.processes.append(
                    subprocess.Popen(
                        [*command, "--worker-index", str(index)],
                        stdin=subprocess.PIPE,
                        env=self.env,
                        start_new_session=True,
                    )
                )
        except BaseException:
            self.stop()
            raise

    def begin(self, search_dir: Path, deadline: float | None, storage: str | None = None) -> None:
        """Tell the workers the search; `storage`: its URL with the password that search.json
        does not keep (a pipe: never in a command line or an environment others may read)."""
        search = {"search_dir": str(search_dir), "deadline": deadline, "storage": storage}
        told = json.dumps(search) + "\n"
        self.told = True
        for process in self.processes:
            assert process.stdin is not None
            # One that died already: its exit status says so when it is waited for.
            with contextlib.suppress(OSError):
                process.stdin.write(told.encode())
                process.stdin.close()

    def wait(self) -> list[int]:
        return [process.wait() for process in self.processes]

    def stop(self) -> None:
        """Stop whoever still runs (see `_stop_all`). Workers never told a search hold
        nothing yet (no folder, no trial): they are killed, not stopped as after a Ctrl-C,
        which had each print 'interrupted' above the error that stopped the search."""
        for process in self.processes:
            if process.stdin is not None and not process.stdin.closed:
                with contextlib.suppress(OSError):
                    process.stdin.close()
        if not self.told:
            for process in self.processes:
                if process.poll() is None:
                    with contextlib.suppress(OSError):
                        process.kill()
                    process.wait()
        _stop_all(self.processes)


def wait_for_search() -> tuple[Path, float | None, str | None] | None:
    """In a worker process (`loom search --worker`): get ready to train, then read the
    search folder, the deadline and the storage with its password (or None) from stdin; None
    when the search never began."""
    import torch._dynamo  # noqa: F401  (what building any optimizer imports: seconds, spent now)

    import torchloom.search.worker  # noqa: F401

    line = sys.stdin.readline()
    if not line.strip():
        return None
    told = json.loads(line)
    return Path(told["search_dir"]), told["deadline"], told.get("storage")


def run_workers(
    search_dir: Path,
    record: SearchRecord,
    workers: int,
    hook_factory: Any = None,
    say: Say = print,
    started: WorkerProcesses | None = None,
) -> int:
    """Run the study's remaining trials with `workers` processes (worker 0 in this one, the
    others `started` already or started now); returns 130 when stopped by Ctrl-C / SIGTERM /
    SIGHUP (the study keeps what finished; `--resume` continues), else the first worker's
    non-zero exit status (a crashed worker), else 0."""
    timeout = record.settings.get("timeout")
    deadline = time.time() + float(timeout) if timeout else None
    # SIGHUP stops a search as SIGTERM and Ctrl-C do, unless ignored (`nohup`): its workers
    # stopped, its trials queued again (by default it would kill this process and leave the
    # workers running). SIGINT stops it even when the search started with SIGINT ignored (a
    # script's background job inherits that; so do the workers, which the search stops with
    # SIGINT). The `loom` command does so from its start (cli/main.py), its workers too; this
    # is for `torchloom.search` in a program.
    with stopping_on_signals():
        if workers <= 1:
            from torchloom.search.worker import work

            try:
                work(search_dir, record, hook_factory, say, deadline)
            except KeyboardInterrupt:
                return 130
            return 0
        others = started if started is not None else WorkerProcesses(workers - 1)
        return _run_processes(search_dir, record, others, hook_factory, say, deadline)


def _run_processes(
    search_dir: Path,
    record: SearchRecord,
    others: WorkerProcesses,
    hook_factory: Any,
    say: Say,
    deadline: float | None,
) -> int:
    """Worker 0 in this process and the others each in a process of their own: a process
    start-up (torch's import, the data read again) is seconds of a core, which --workers K
    on K cores would otherwise take from the trials."""
    from torchloom.search.results import import_result_modules
    from torchloom.search.trial import DeviceUnusable
    from torchloom.search.worker import work

    codes: list[int] = []
    try:
        try:
            others.begin(search_dir, deadline, record.storage_with_password)
            stopped = None
            with _torch_threads(others.env["OMP_NUM_THREADS"]):  # as many as each other worker
                try:
                    work(search_dir, record, hook_factory, say, deadline, worker=0)
                except DeviceUnusable as error:  # this worker's GPU; the others' are fine
                    stopped = error
            import_result_modules()  # seconds this process would wait for the others anyway
            codes = others.wait()
            if stopped is not None:
                raise stopped
        except KeyboardInterrupt:
            for process in others.processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGINT)
            # Each fails its trial, queues it again and exits; a second Ctrl-C ends the wait
            # (the finally below stops whoever is left).
            _wait_all(others.processes, STOP_GRACE_SECONDS)
            return 130
    finally:
        others.stop()
    return worker_status(codes)


@contextlib.contextmanager
def _torch_threads(setting: str) -> Iterator[None]:
    """torch's intra-op threads set to `setting` (OMP_NUM_THREADS's value) for a block, then
    back: the API's caller keeps its own."""
    import torch

    previous = torch.get_num_threads()
    if ascii_digits(setting) and int(setting) > 0:
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


def continue_worker(hook_factory: Any, index: int) -> int:
    """One worker process of `--workers K` (the hidden `loom search --worker`, told its
    search on stdin: see `WorkerProcesses`): it stops as on Ctrl-C when the `loom search`
    that started it is gone."""
    from torchloom.search.worker import work

    parent = int(os.environ.get(PARENT_ENV, "0") or 0)
    if parent:
        stop_with_parent(parent)
    told = wait_for_search()
    if told is None:
        return 0
    search_dir, deadline, storage = told
    record = read_record(search_dir)
    if storage is not None:
        record.give_storage(storage)
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
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent:
        raise KeyboardInterrupt
