"""A search's start: check the space, make the search folder and the study, or find them
again to resume (the workers that run the trials: processes.py; the results: results.py).

    <expdir>/searches/<name>/<date>/
      search.json  config.yaml  [space.yml]   what the search is (record.py)
      study.journal                           the Optuna study (unless --storage)
      trials/<name>/<date>_trialN/            each trial's run folder
      trials.csv  best.yml  importance.json  plots/  search.html   (results.py, page.py)
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchloom.analysis.run_reading import lower_is_better
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
from torchloom.search.record import RECORD, SearchRecord, read_record
from torchloom.search.settings import grid_size, read_settings
from torchloom.search.storage_urls import has_password, hide_password, same_storage
from torchloom.search.study import config_digest, create_study, journal_url, load_study


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
    expdir: str | None = None  # runs/ when not given (a resumed search keeps its folder)
    device: str | None = None
    resume: str | os.PathLike[str] | None = None


def prepare_search(request: SearchRequest) -> tuple[Path, SearchRecord]:
    """Check everything, then make the search folder and the study: (folder, record). A
    refused space or config leaves nothing behind."""
    if request.config is None:
        raise ConfigError.at("command line", "config", "give a config file or --resume DIR")
    check_seed_and_study(request.seed, request.study)
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
        storage=journal_url(),
        monitor=monitor,
        mode=mode,
        trials=trials,
        settings=settings.to_json(),
        seed=request.seed,
        device=request.device,
        space="space.yml" if request.space is not None else None,
        digest=config_digest(config_text, space_text),
    )
    record.give_storage(request.storage or journal_url())  # search.json keeps no password
    if not record.storage_in_folder():
        # A shared storage: its study is created, or checked to be this search's, before any
        # folder; an unreachable database or another search's study leaves nothing behind.
        create_study(record.storage_url(), record.study, _identity(record))
    search_dir = create_run_folder(Path(request.expdir or "runs").expanduser() / "searches", name)
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
    "study": "--study",
    "monitor": "--monitor",
    "mode": "--mode",
    "space": "--space",
    "device": "--device",
    "expdir": "--expdir",  # it continues in its own folder
}


def check_kept_on_resume(request: SearchRequest) -> None:
    """What a resumed search keeps from its start is not given again (--storage: only to give
    its password again, resume_search)."""
    for key, option in KEPT_ON_RESUME.items():
        if getattr(request, key) is not None:
            raise ConfigError.at(
                "command line",
                option,
                "cannot change a resumed search: it keeps what it started with",
                f"drop {option}, or start a new search",
            )


def check_budget(
    trials: int | None,
    timeout: float | None,
    where: str = "command line",
    names: tuple[str, str] = ("--trials", "--timeout"),
) -> None:
    """--trials and --timeout (`names`: how the caller gave them), when given, are positive
    (0 trials or a past time limit would run nothing and say nothing)."""
    if trials is not None and trials <= 0:
        raise ConfigError.at(where, names[0], f"must be 1 or more, got {trials}")
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise ConfigError.at(where, names[1], f"must be a number of seconds above 0, got {timeout}")


def check_seed_and_study(
    seed: int | None,
    study: str | None,
    where: str = "command line",
    names: tuple[str, str] = ("--seed", "--study"),
) -> None:
    """A search's seed seeds NumPy's generators (0 to 2**32 - 1: -1 failed in a traceback
    after the folder was made); a study name given empty was replaced without a word."""
    if seed is not None and not 0 <= seed < 2**32:
        raise ConfigError.at(where, names[0], f"must be from 0 to 2**32 - 1, got {seed}")
    if study is not None and not study.strip():
        raise ConfigError.at(where, names[1], "is empty", "name the study, or leave it out")


def resume_search(request: SearchRequest) -> tuple[Path, SearchRecord]:
    """A search folder to continue, with --trials / --timeout given again when set; what the
    search started with (sampler, study, space, ...) is refused, not silently ignored."""
    assert request.resume is not None
    if request.config is not None or request.overrides:
        raise ConfigError.at(
            "command line",
            "--resume",
            "continues a search as it started: no config or overrides",
            "drop them, or start a new search",
        )
    check_kept_on_resume(request)
    check_budget(request.trials, request.timeout)
    search_dir = Path(request.resume).expanduser()
    record = read_record(search_dir)
    if request.storage is not None:
        _give_password_again(record, request.storage)
    # The study must still exist, and still be this search's (not deleted and made again).
    load_study(record.storage_url(search_dir), record.study, None, None, record.study_identity())
    if request.trials is not None:
        record.trials = request.trials
    if request.timeout is not None:
        record.settings = {**record.settings, "timeout": request.timeout}
    if request.storage is None and record.storage_with_password:
        # An older torchloom's folder: its password used now, and no longer kept.
        print(
            f"{search_dir / RECORD} no longer keeps the storage's password: give it next time "
            "with PGPASSWORD, ~/.pgpass or --storage",
            file=sys.stderr,
        )
    record.save(search_dir)
    return search_dir, record


def _give_password_again(record: SearchRecord, storage: str) -> None:
    """--storage on a resume: the search's own storage, with the password its folder does not
    keep; any other storage is refused (a resumed search keeps its study where it is)."""
    if not same_storage(storage, record.storage):
        raise ConfigError.at(
            "command line",
            "--storage",
            f"names another storage than this search's ({hide_password(record.storage)}): "
            "a resumed search keeps its storage",
            "give --storage only to give the password of the search's own database, or drop it",
        )
    if has_password(storage):
        record.storage_with_password = storage


def monitor_of(
    data: Mapping[str, Any], monitor: str | None, mode: str | None, statistics: set[str]
) -> tuple[str, str]:
    """The statistic to optimise: --monitor, else the config's early-stopping monitor, else
    validation.loss; its mode: --mode, else early stopping's for the same statistic, else min
    for losses and errors (`lower_is_better`, as the reports rank runs: `loss_a` and
    `loss_std` too) and max for the rest."""
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
            mode = "min" if lower_is_better(monitor) else "max"
    return str(monitor), mode
