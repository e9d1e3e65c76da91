"""The Python API of search: `torchloom.search(...)`, on the machinery of `loom search`.

    import torchloom
    found = torchloom.search("lenet5.yml", space={"training.optimizer.lr":
                             {"loguniform": [1.0e-4, 1.0e-1]}}, trials=20)
    found.best_value, found.best_params, found.best_config     # best.yml: `loom train` it

Code first, in Torch Research Workflows' style: a function receives `hp` and returns a
config (a mapping); `hp.float`, `hp.int` and `hp.choice` are the search space.

    def build(hp):
        config = base_config()
        config["training"]["optimizer"]["lr"] = hp.float("lr", 1e-5, 1e-1, log=True)
        config["pipeline"]["classifier"]["hidden_sizes"] = hp.choice("hidden", [[64], [128, 64]])
        return config

    torchloom.search(build, trials=20, monitor="validation.accuracy", mode="max")
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchloom.analysis.build import build_hooks
from torchloom.api import create_run_folder, load_and_validate, pipeline_name
from torchloom.config import dump_config
from torchloom.config.loading import ConfigSource
from torchloom.errors import ConfigError
from torchloom.search.checking import TRIAL_OVERRIDES, SpaceSource, check_trial_config
from torchloom.search.page import write_page
from torchloom.search.processes import run_workers
from torchloom.search.record import SearchRecord, check_importance
from torchloom.search.results import TRIAL_COLUMNS, sampled_values, write_results
from torchloom.search.runner import (
    SearchRequest,
    check_budget,
    check_seed_and_study,
    monitor_of,
    prepare_search,
    resume_search,
)
from torchloom.search.settings import SearchSettings, component_spec, grid_points_problem
from torchloom.search.space import Parameter, parse_parameter
from torchloom.search.study import config_digest, create_study, journal_url
from torchloom.search.trial import DeviceUnusable
from torchloom.search.worker import Proposal, work
from torchloom.signals import stopping_on_signals

if TYPE_CHECKING:
    import optuna

Builder = Callable[["TrialParameters"], Mapping[str, Any]]


@dataclass
class SearchResult:
    search_dir: Path
    best_value: float | None
    best_params: dict[str, Any]
    best_config: Path | None  # best.yml
    trials: list[dict[str, Any]] = field(default_factory=list)  # the rows of trials.csv


class TrialParameters:
    """The `hp` a code-first builder receives: each call is one parameter of the space, named
    by its first argument, sampled by the study's sampler, and read as the same parameter of
    a YAML space is (space.parse_parameter: its checks, its sampling, its grid), with the
    builder's line as where it was written. Without a trial (the first look at the builder,
    before anything is written) each parameter takes its first value (a range's low end, the
    first option) and its grid is noted. A range Optuna would refuse is a ConfigError: at the
    first look it stops the search; in a trial, a branch the first look did not take, it
    fails that trial."""

    def __init__(self, trial: optuna.trial.BaseTrial | None) -> None:
        self._trial = trial
        self.values: dict[str, Any] = {}
        self.lines: dict[str, str] = {}  # name -> the builder's line that sampled it
        # name -> every value (what the grid sampler enumerates), or None for a float range
        self.grid: dict[str, Parameter] = {}  # each parameter, for the grid sampler

    def float(
        self, name: str, low: float, high: float, *, log: bool = False, step: float | None = None
    ) -> float:
        spec: dict[str, Any] = {"loguniform" if log else "uniform": [low, high]}
        if step is not None:
            spec["step"] = step
        return self._sample(name, spec)

    def int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
        return self._sample(name, {"int": [low, high], "step": step, "log": log})

    def choice(self, name: str, options: Sequence[Any]) -> Any:
        return self._sample(name, {"choice": list(options)})

    def _sample(self, name: str, spec: dict[str, Any]) -> Any:
        where = _builder_line()
        if name in TRIAL_COLUMNS:
            raise ConfigError.at(
                where,
                f"search parameter '{name}'",
                "is a column of trials.csv: its values would overwrite the trial's",
                "give the parameter another name",
            )
        parameter = parse_parameter(name, spec, where)
        self.lines[name] = where
        if self._trial is None:
            value = parameter.corners()[0]
            self.grid[name] = parameter
        else:
            value = parameter.suggest(self._trial)
        self.values[name] = value
        return value

    def grid_space(self) -> dict[str, list[Any]]:
        """The grid sampler's search space; a ConfigError for a range it cannot enumerate."""
        counts = {name: parameter.grid_count() for name, parameter in self.grid.items()}
        ranges = [name for name, count in counts.items() if count is None]
        if ranges:
            raise ConfigError.at(
                "torchloom.search",
                f"search parameter '{ranges[0]}'",
                "is a continuous range, which the grid sampler cannot enumerate",
                "use hp.choice or hp.int (without log), or another sampler",
            )
        too_many = grid_points_problem({k: v or 0 for k, v in counts.items()})
        if too_many:
            raise ConfigError.at(
                "torchloom.search", "search space", too_many, "search fewer values"
            )
        return {name: parameter.grid() or [] for name, parameter in self.grid.items()}


def _builder_line() -> str:
    """file:line of the builder's `hp.*` call: the first frame outside this module."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def search(
    config: ConfigSource | Builder | None = None,
    space: SpaceSource | None = None,
    *,
    trials: int | None = None,
    overrides: Sequence[str] = (),
    sampler: str | None = None,
    pruner: str | None = None,
    monitor: str | None = None,
    mode: str | None = None,
    storage: str | None = None,
    study: str | None = None,
    timeout: float | None = None,
    seed: int | None = None,
    expdir: str | None = None,
    device: str | None = None,
    workers: int = 1,
    resume: str | os.PathLike[str] | None = None,
    quiet: bool = True,
    importance: str | None = None,
) -> SearchResult:
    """Search a YAML config's space (its `search:` section, a space file or a mapping), or a
    code-first builder's; or continue the search folder `resume`. Raises LoomError for
    anything the user can fix; a failed trial is recorded, never raised. Ctrl-C writes the
    results so far, then raises KeyboardInterrupt (`resume=search_dir` continues).
    `importance`: "ped-anova" (default) or "fanova", kept in the folder for `loom report`."""
    say: Callable[[str], None] = (lambda line: None) if quiet else print
    check_importance(importance, "torchloom.search importance")
    interrupted, stopped = False, None
    request = SearchRequest(
        config=None if callable(config) else config,
        overrides=overrides,
        space=space,
        trials=trials,
        sampler=sampler,
        pruner=pruner,
        monitor=monitor,
        mode=mode,
        storage=storage,
        study=study,
        workers=workers,
        timeout=timeout,
        seed=seed,
        expdir=expdir,
        device=device,
        resume=resume,
    )
    if callable(config):
        if workers != 1:
            raise ConfigError.at(
                "torchloom.search", "workers", "a code-first search runs in this process only"
            )
        # Signals as `loom search` takes them from its start: the study's creation holds a
        # stop to its end (create_study).
        with stopping_on_signals():
            search_dir, record = _code_first(config, replace(request, config=None))
        propose = _proposer(config)
        try:
            # As run_workers does for a YAML search: it clears the stops an earlier search in
            # this process recorded (a Ctrl-C ended every later one and its resume at once).
            with stopping_on_signals():
                work(search_dir, record, build_hooks, say, _deadline(record), propose)
        except KeyboardInterrupt:
            interrupted = True
        except DeviceUnusable as error:
            stopped = error
    else:
        with stopping_on_signals():
            prepared = resume_search(request) if resume is not None else prepare_search(request)
        search_dir, record = prepared
        try:
            interrupted = run_workers(search_dir, record, workers, build_hooks, say) == 130
        except DeviceUnusable as error:
            stopped = error
    record.set_importance(importance, search_dir)  # kept for `loom report`
    results = write_results(search_dir, record)
    write_page(search_dir, record, results)
    if stopped is not None:  # what finished is written; `resume=search_dir` continues
        raise stopped
    if interrupted:
        raise KeyboardInterrupt
    best = results.best
    return SearchResult(
        search_dir,
        best.value if best is not None else None,
        sampled_values(best) if best is not None else {},
        search_dir / "best.yml" if (search_dir / "best.yml").is_file() else None,
        results.rows,
    )


def _deadline(record: SearchRecord) -> float | None:
    import time

    timeout = record.settings.get("timeout")
    return time.time() + float(timeout) if timeout else None


def _proposer(build: Builder) -> Callable[[optuna.Trial], Proposal]:
    def propose(trial: optuna.Trial) -> Proposal:
        hp = TrialParameters(trial)
        config = _config_of(build, build(hp))
        return config, list(TRIAL_OVERRIDES[1:]), hp.values

    return propose


def _config_of(build: Builder, built: Any) -> dict[str, Any]:
    if isinstance(built, Mapping):
        return dict(built)
    name = getattr(build, "__qualname__", repr(build))
    raise ConfigError.at(
        "torchloom.search",
        f"code-first builder {name}",
        f"returned {type(built).__name__}, not a config (a mapping)",
        "a model of your own is a component of the config (docs/writing-a-component.md): "
        "name its class in the pipeline (type: my_module:MyModel) and set its arguments from hp",
    )


def _code_first(build: Builder, request: SearchRequest) -> tuple[Path, SearchRecord]:
    if request.resume is not None:  # what it started with is kept, a change refused, as YAML's
        return resume_search(request)
    if request.trials is None:
        raise ConfigError.at("torchloom.search", "trials", "says how many trials to run")
    # The builder's config at the first values (low ends, first choices) names the search
    # and says what the monitor is; every trial's config is checked again when it starts.
    where = "torchloom.search"
    # Checked before any trial, as the YAML path checks them: a mode other than min/max was
    # taken for min (the worst trial chosen as best), a misspelt monitor failed every trial
    # after it trained, and 0 trials ran nothing and said nothing.
    check_budget(request.trials, request.timeout, where, ("trials", "timeout"))
    check_seed_and_study(request.seed, request.study, where, ("seed", "study"))
    if request.mode is not None and request.mode not in ("min", "max"):
        raise ConfigError.at(where, "mode", f"must be min or max, got {request.mode!r}")
    first = TrialParameters(None)
    config = _config_of(build, build(first))
    loaded, _ = load_and_validate(config)
    statistics = check_trial_config(config, [])
    monitor, mode = monitor_of(loaded.data, request.monitor, request.mode, statistics)
    if monitor in first.values:
        raise ConfigError.at(
            first.lines[monitor],
            f"search parameter '{monitor}'",
            "has the monitor's name: trials.csv would show its values as the trials'",
            "give the parameter another name",
        )
    settings = SearchSettings(
        sampler=component_spec("sampler", request.sampler or "tpe", where),
        pruner=component_spec("pruner", request.pruner or "none", where),
        monitor=monitor,
        mode=mode,
        trials=request.trials,
        timeout=request.timeout,
    )
    if settings.sampler["type"] == "grid":
        settings.sampler.setdefault("search_space", first.grid_space())
    name = pipeline_name(loaded)
    record = SearchRecord(
        name=name,
        study=request.study or name,
        storage=journal_url(),
        monitor=monitor,
        mode=mode,
        trials=request.trials,
        settings=settings.to_json(),
        seed=request.seed,
        device=request.device,
        config="",
        digest=config_digest(dump_config(loaded.data)),
    )
    record.give_storage(request.storage or journal_url())  # search.json keeps no password
    identity = record.study_identity()
    assert identity is not None
    if not record.storage_in_folder():  # checked before any folder (runner.prepare_search)
        create_study(record.storage_url(), record.study, identity)
    search_dir = create_run_folder(Path(request.expdir or "runs").expanduser() / "searches", name)
    record.save(search_dir)
    if record.storage_in_folder():
        create_study(record.storage_url(search_dir), record.study, identity)
    return search_dir, record
