"""A search from start to end: check the space, make the search folder and the study, run
the workers (this process, or K processes sharing the study), write the results.

    <expdir>/searches/<name>/<date>/
      search.json  config.yaml  [space.yml]   what the search is (record.py)
      study.journal                           the Optuna study (unless --storage)
      trials/<name>/<date>_trialN/            each trial's run folder
      trials.csv  best.yml  importance.json  plots/  search.html   (results.py, page.py)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from torchloom.api import create_run_folder, pipeline_name
from torchloom.config import dump_config, load_config
from torchloom.config.loading import ConfigSource
from torchloom.errors import ConfigError, did_you_mean
from torchloom.search.checking import (
    SpaceSource,
    check_trial_config,
    check_values,
    read_space,
)
from torchloom.search.record import SearchRecord, read_record
from torchloom.search.settings import grid_size, read_settings
from torchloom.search.study import config_digest, create_study, journal_url, load_study
from torchloom.search.worker import Say, work


@dataclass
class SearchRequest:
    """What `loom search` and `torchloom.search` are asked (None: from the config, or the
    default)."""

    config: ConfigSource | None = None
    overrides: Sequence[str] = ()
    space: SpaceSource | None = None
    trials: int | None = None
    sampler: str | None = None
    pruner: str | None = None
    monitor: str | None = None
    mode: str | None = None
    storage: str | None = None
    study: str | None = None
    workers: int = 1
    timeout: float | None = None
    seed: int | None = None
    expdir: str = "runs"
    device: str | None = None
    resume: str | os.PathLike[str] | None = None


def prepare_search(request: SearchRequest) -> tuple[Path, SearchRecord]:
    """Check everything, then make the search folder and the study: (folder, record). A
    refused space or config leaves nothing behind."""
    if request.config is None:
        raise ConfigError.at("command line", "config", "give a config file or --resume DIR")
    loaded = load_config(request.config, request.overrides)
    space = read_space(loaded, request.space)
    command_line = {
        "sampler": request.sampler,
        "pruner": request.pruner,
        "monitor": request.monitor,
        "mode": request.mode,
        "trials": request.trials,
        "timeout": request.timeout,
    }
    settings = read_settings(space, command_line)
    base = [o for o in ("~search",) if "search" in loaded.data]
    statistics = check_trial_config(request.config, [*request.overrides, *base])
    monitor, mode = monitor_of(loaded.data, settings.monitor, settings.mode, statistics)
    check_values(request.config, request.overrides, loaded, space)
    trials = settings.trials
    if trials is None and settings.sampler["type"] == "grid":
        trials = grid_size(space)
    if trials is None:
        raise ConfigError.at(
            "command line", "--trials", "says how many trials to run", "e.g. --trials 20"
        )
    name = pipeline_name(loaded)
    # Named: trials' run folders and best.yml keep the pipeline's name, not "config".
    saved = {"name": name, **{k: v for k, v in loaded.data.items() if k != "name"}}
    config_text = dump_config(saved)
    space_text = ""
    if isinstance(request.space, Mapping):
        space_text = dump_config(dict(request.space))
    elif request.space is not None:
        space_text = Path(request.space).read_text(encoding="utf-8")
    record = SearchRecord(
        name=name,
        study=request.study or name,
        storage=request.storage or journal_url(),
        monitor=monitor,
        mode=mode,
        trials=trials,
        settings=settings.to_json(),
        seed=request.seed,
        device=request.device,
        space="space.yml" if request.space is not None else None,
        digest=config_digest(config_text, space_text),
    )
    if not record.storage_in_folder():
        # A shared storage: its study is created, or checked to be this search's, before any
        # folder; an unreachable database or another search's study leaves nothing behind.
        create_study(record.storage, record.study, _identity(record))
    search_dir = create_run_folder(Path(request.expdir).expanduser() / "searches", name)
    (search_dir / "config.yaml").write_text(config_text, encoding="utf-8")
    if request.space is not None:
        (search_dir / "space.yml").write_text(space_text, encoding="utf-8")
    record.save(search_dir)
    if record.storage_in_folder():  # a fresh journal: no other search's study in it
        create_study(record.storage_url(search_dir), record.study, _identity(record))
    return search_dir, record


def _identity(record: SearchRecord) -> dict[str, str]:
    identity = record.study_identity()
    assert identity is not None  # a new record has its digest
    return identity


# What a resumed search keeps from its start: the command line may not change them.
KEPT_ON_RESUME = {
    "sampler": "--sampler",
    "pruner": "--pruner",
    "seed": "--seed",
    "storage": "--storage",
    "study": "--study",
    "monitor": "--monitor",
    "mode": "--mode",
    "space": "--space",
    "device": "--device",
}


def check_budget(trials: int | None, timeout: float | None) -> None:
    """--trials and --timeout, when given, are positive (0 trials or a past time limit would
    run nothing and say nothing)."""
    if trials is not None and trials <= 0:
        raise ConfigError.at("command line", "--trials", f"must be 1 or more, got {trials}")
    if timeout is not None and not timeout > 0:
        raise ConfigError.at("command line", "--timeout", f"must be above 0 s, got {timeout}")


def resume_search(request: SearchRequest) -> tuple[Path, SearchRecord]:
    """A search folder to continue, with --trials / --timeout given again when set; what the
    search started with (sampler, study, space, ...) is refused, not silently ignored."""
    assert request.resume is not None
    for key, option in KEPT_ON_RESUME.items():
        if getattr(request, key) is not None:
            raise ConfigError.at(
                "command line",
                option,
                "cannot change a resumed search: it keeps what it started with",
                f"drop {option}, or start a new search",
            )
    check_budget(request.trials, request.timeout)
    search_dir = Path(request.resume).expanduser()
    record = read_record(search_dir)
    # The study must still exist, and still be this search's (not deleted and made again).
    load_study(record.storage_url(search_dir), record.study, None, None, record.study_identity())
    if request.trials is not None:
        record.trials = request.trials
    if request.timeout is not None:
        record.settings = {**record.settings, "timeout": request.timeout}
    record.save(search_dir)
    return search_dir, record


def monitor_of(
    data: Mapping[str, Any], monitor: str | None, mode: str | None, statistics: set[str]
) -> tuple[str, str]:
    """The statistic to optimise: --monitor, else the config's early-stopping monitor, else
    validation.loss; its mode: --mode, else early stopping's for the same statistic, else min
    for losses and errors and max for the rest."""
    stopping = (data.get("training", {}).get("terminal_conditions") or {}).get("early_stopping")
    stopping = stopping if isinstance(stopping, Mapping) else {}
    if monitor is None:
        monitor = stopping.get("monitor") or (
            "validation.loss" if "validation" in data else "training.loss"
        )
    if statistics and monitor not in statistics:
        raise ConfigError.at(
            "search setting 'monitor'",
            monitor,
            "is not a statistic of this pipeline",
            did_you_mean(monitor, statistics) or f"statistics: {', '.join(sorted(statistics))}",
        )
    if mode is None:
        if stopping.get("monitor") == monitor and stopping.get("mode") in ("min", "max"):
            mode = str(stopping["mode"])
        else:
            mode = "min" if monitor.endswith(("loss", "error", "perplexity")) else "max"
    return str(monitor), mode


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
