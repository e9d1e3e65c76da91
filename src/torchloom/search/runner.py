"""A search from start to end: check the space, make the search folder and the study, run
the workers (this process, or K processes sharing the study), write the results.

    <expdir>/searches/<name>/<date>/
      search.json  config.yaml  [space.yml]   what the search is (record.py)
      study.journal                           the Optuna study (unless --storage)
      trials/<name>/<date>_trialN/            each trial's run folder
      trials.csv  best.yml  importance.json  plots/  search.html   (results.py, page.py)
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchloom.config import dump_config, load_config
from torchloom.config.loading import ConfigSource
from torchloom.engine.assemble import pipeline_name
from torchloom.engine.run_folder import create_run_folder
from torchloom.errors import ConfigError, did_you_mean
from torchloom.search.checking import (
    SpaceSource,
    check_trial_config,
    check_values,
    read_space,
)
from torchloom.search.record import SearchRecord, read_record
from torchloom.search.settings import grid_size, read_settings
from torchloom.search.study import create_study, journal_url, open_storage
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
    if request.storage is not None:
        open_storage(request.storage)  # an unreachable database: refused before any folder
    name = pipeline_name(loaded)
    search_dir = create_run_folder(Path(request.expdir).expanduser() / "searches", name)
    # Named: trials' run folders and best.yml keep the pipeline's name, not "config".
    saved = {"name": name, **{k: v for k, v in loaded.data.items() if k != "name"}}
    (search_dir / "config.yaml").write_text(dump_config(saved), encoding="utf-8")
    if isinstance(request.space, Mapping):
        (search_dir / "space.yml").write_text(dump_config(dict(request.space)), encoding="utf-8")
    elif request.space is not None:
        shutil.copyfile(request.space, search_dir / "space.yml")
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
    )
    record.save(search_dir)
    create_study(record.storage_url(search_dir), record.study, record.direction)
    return search_dir, record


def resume_search(request: SearchRequest) -> tuple[Path, SearchRecord]:
    """A search folder to continue, with --trials / --timeout given again when set."""
    assert request.resume is not None
    search_dir = Path(request.resume).expanduser()
    record = read_record(search_dir)
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
    Ctrl-C / SIGTERM (the study keeps what finished; `--resume` continues), else 0."""
    timeout = record.settings.get("timeout")
    deadline = time.time() + float(timeout) if timeout else None
    if workers <= 1:
        try:
            work(search_dir, record, hook_factory, say, deadline)
        except KeyboardInterrupt:
            return 130
        return 0
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # one torch thread per worker unless told otherwise
    env.setdefault("MKL_NUM_THREADS", env["OMP_NUM_THREADS"])
    command = [sys.executable, "-m", "torchloom.cli.main", "search", "--worker", str(search_dir)]
    if deadline is not None:
        command += ["--deadline", str(deadline)]
    # Sessions of their own: a Ctrl-C at the terminal reaches this process alone, which hands
    # each worker exactly one SIGINT (a second one would stop its run at once, unsaved).
    processes = [
        subprocess.Popen([*command, "--worker-index", str(index)], env=env, start_new_session=True)
        for index in range(workers)
    ]
    status = 0
    try:
        for process in processes:
            code = process.wait()
            status = 130 if code == 130 else status
    except KeyboardInterrupt:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        for process in processes:  # each fails its trial, queues it again and exits
            process.wait()
        status = 130
    return status


def continue_worker(
    search_dir: Path, deadline: float | None, hook_factory: Any, index: int = 0
) -> int:
    """One worker process of `--workers K` (the hidden `loom search --worker DIR`)."""
    record = read_record(search_dir)
    try:
        work(search_dir, record, hook_factory, print, deadline, worker=index)
    except KeyboardInterrupt:
        return 130
    return 0
