"""A search worker: asks the study for trials and runs them until the study has its trials
(or the time limit passed). One process runs one worker; `--workers K` starts K of them on
the same study (processes.py). Every ending of a trial is told to the study with its reason;
only Ctrl-C / SIGTERM ends the worker early, its trial failed and queued again."""

from __future__ import annotations

import contextlib
import gc
import random
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchloom.api import TrainOptions, failure_reason, reproducible_cublas_workspace
from torchloom.config import load_config
from torchloom.errors import LoomError
from torchloom.search.checking import read_space, trial_overrides
from torchloom.search.claims import (
    ask_lock,
    claim_trial,
    counted_trials,
    heartbeats,
    queue_retry,
    reap_dead_trials,
    record_identity,
)
from torchloom.search.record import SearchRecord
from torchloom.search.results import VALUES
from torchloom.search.space import SearchSpace
from torchloom.search.study import draw_number, load_study, make_pruner, make_sampler
from torchloom.search.trial import (
    DeviceFailed,
    DeviceUnusable,
    Objective,
    Pruned,
    TrialFailed,
    run_trial,
)
from torchloom.signals import stop_asked, stops_held

if TYPE_CHECKING:
    import optuna

Say = Callable[[str], None]


# A trial's config: (config source, overrides, the values sampled for it).
Proposal = tuple[Any, list[str], dict[str, Any]]
Propose = Callable[["optuna.Trial"], Proposal]


def yaml_proposer(
    search_dir: Path, record: SearchRecord
) -> tuple[Propose, SearchSpace, int | None]:
    """Trials of a YAML space: the search folder's config.yaml with the sampled values as
    overrides; the space (for the grid sampler); and the epochs every trial trains (for the
    pruner), when they are known (trial_epochs)."""
    loaded = load_config(search_dir / record.config)
    space = read_space(loaded, search_dir / record.space if record.space else None)

    def propose(trial: optuna.Trial) -> Proposal:
        values = space.sample(trial, loaded.data)
        return search_dir / record.config, trial_overrides(loaded, values), values

    return propose, space, trial_epochs(loaded.data, space)


def trial_epochs(config: Mapping[str, Any], space: SearchSpace) -> int | None:
    """The epochs every trial of this config trains when it is not stopped early, which are
    the steps a pruner hears (PruningReporter): the epoch limit of an offline run, unless
    the space searches the terminal conditions or the mode; None when not known so."""
    training = config.get("training") or {}
    conditions = training.get("terminal_conditions") or {}
    searched = any(
        path.startswith(("training.terminal_conditions", "training.mode"))
        for path in space.parameters
    )
    epochs = conditions.get("epoch_limit")
    if searched or training.get("mode", "offline") != "offline" or not isinstance(epochs, int):
        return None
    # An episode limit may end every trial before its epochs: then no one knows.
    return None if conditions.get("episode_limit") is not None else epochs


def work(
    search_dir: Path,
    record: SearchRecord,
    hook_factory: Any = None,
    say: Say = print,
    deadline: float | None = None,
    propose: Propose | None = None,
    worker: int = 0,
    orphaned: Callable[[], bool] | None = None,
) -> int:
    """Run trials until the study counts `record.trials` of them; returns how many ran here.
    `propose` makes a trial's config (default: the YAML space of the search folder); `worker`
    numbers the processes of `--workers K` (0 to K-1); `orphaned` says, between trials,
    whether the `loom search` that started this worker is gone (then it stops)."""
    # Trials share this process: one may turn training.deterministic on after others ran.
    reproducible_cublas_workspace()
    space, epochs = None, None
    if propose is None:
        propose, space, epochs = yaml_proposer(search_dir, record)
    settings = record.search_settings()
    seed = record.seed if record.seed is not None else settings.sampler.get("seed")
    url = record.storage_url(search_dir)
    sampler = make_sampler(settings, space, seed)
    study = load_study(
        url,
        record.study,
        sampler,
        make_pruner(settings, epochs),
        record.study_identity(),
    )
    objective = Objective(record.monitor, record.mode)
    device = worker_device(record.device, worker)
    options = TrainOptions(
        expdir=str(search_dir / "trials"),
        device=device,
        quiet=True,
        tensorboard=0,
        hook_factory=hook_factory,
    )
    ran = 0
    while True:
        if stop_asked():  # a signal whose interrupt the code it cut short swallowed
            raise KeyboardInterrupt
        if orphaned is not None and orphaned():
            say("search worker: `loom search` is gone; no new trial starts")
            break
        trial = None
        try:
            # A stop between the ask and the naming of the trial's process would leave it
            # RUNNING with no one to end it (unnamed, no reaper can judge it): held to the end
            # of the naming, where the trial is failed and queued again like one stopped
            # mid-run.
            with stops_held(), ask_lock(search_dir, url, study) as exact:
                for number in reap_dead_trials(study):
                    say(f"trial {number}: its process died; failed, its parameters queued again")
                if counted_trials(study) >= record.trials:
                    break
                if deadline is not None and time.time() >= deadline:
                    say("search: --timeout reached; no new trial starts")
                    break
                if seed is not None:  # the place the trial asked for now gets (make_sampler)
                    asked = study.get_trials(deepcopy=False)  # one read of the study, locked
                    number, draw = len(asked), draw_number(asked)
                    study.sampler = make_sampler(settings, space, seed, draw)
                trial = claim_trial(study, record.trials, exact)
                if seed is not None and trial is not None and trial.number != number:
                    # A queued trial taken again, or another machine's ask at the same moment
                    # where the lock does not cover it: the values drawn from here on (all but
                    # a multivariate sampler's, drawn at the ask) follow the trial's own place.
                    draw = draw_number(study.get_trials(deepcopy=False), trial.number)
                    study.sampler = make_sampler(settings, space, seed, draw)
                if trial is not None:
                    record_identity(trial)
            if trial is None:  # another machine took the last trial at the same moment
                time.sleep(random.uniform(0.05, 0.5))  # if it handed its own back too: apart
                continue
            with heartbeats(trial._trial_id, study._storage):
                _run_one(study, trial, propose, search_dir, objective, options, say)
        except BaseException as error:
            # A stop, or a failure (a database's) that ended the worker: the claimed trial
            # would stay RUNNING, perhaps unnamed (no reaper could judge it). _run_one's own
            # handling, where it ran, left it finished.
            if trial is not None:
                stopped = isinstance(error, KeyboardInterrupt)
                with contextlib.suppress(Exception):  # the database may be what failed
                    _queue_again_if_unfinished(study, trial, say, None if stopped else error)
            raise
        # Not on the way out (a stop, a broken GPU): a stop must reach the other workers at
        # once, before they finish a trial and take the next.
        _release_the_trial()
        ran += 1
    return ran


def _release_the_trial() -> None:
    """What a trial left goes before the next one starts in this process:
    - a run that failed or diverged is held in reference cycles through its exception's
      traceback (its model, optimizer state, last batch: on a GPU, memory the next trial
      needs) until Python's full collection, which nothing else would start in time;
    - torch.compile's caches of its models: dynamo compiles a code object (a model class's
      forward) at most 8 times, so after a few trials of other sizes the next trials' models
      would run eagerly, with nothing said but one warning."""
    import torch

    gc.collect()
    if "torch._dynamo" in sys.modules:
        torch.compiler.reset()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _run_one(
    study: optuna.Study,
    trial: optuna.Trial,
    propose: Propose,
    search_dir: Path,
    objective: Objective,
    options: TrainOptions,
    say: Say,
) -> None:
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    started = time.perf_counter()
    options = replace(options, tag=f"trial{trial.number}")

    def on_run_dir(run_dir: Path) -> None:
        trial.set_user_attr("run_dir", str(run_dir.relative_to(search_dir)))
        # In the study too: with a database, the best trial may have run on another machine,
        # and best.yml is written wherever the search ends.
        config = (run_dir / "config.yaml").read_text(encoding="utf-8")
        trial.set_user_attr("config", config)

    shown = ""
    try:
        try:
            source, overrides, values = propose(trial)
        except LoomError as error:  # a code-first builder refusing its values
            raise TrialFailed(failure_reason(error)) from error
        except UpdateFinishedTrialError:
            raise  # finished by another process meanwhile: dropped below, not failed
        except Exception as error:  # a builder's own bug, or Optuna refusing a distribution
            raise TrialFailed(f"its values could not be drawn: {failure_reason(error)}") from error
        # As sampled: Optuna's params hold a list or mapping choice as its JSON text.
        trial.set_user_attr(VALUES, values)
        names = short_names(list(values))
        shown = ", ".join(f"{names[k]}={_short(v)}" for k, v in values.items())
        value, _ = run_trial(trial, source, overrides, objective, options, on_run_dir)
        # Recorded inside the try: a stop landing here, before the value is stored, fails and
        # queues the trial as one stopped mid-run (after, the complete trial stands), rather
        # than leaving it RUNNING until a resume reaps it as one whose process died.
        if _finish(study, trial, say, {}, value):
            seconds = f"{time.perf_counter() - started:.1f} s"
            say(f"trial {trial.number}: {objective.monitor}={value:.4g} in {seconds} [{shown}]")
    except Pruned as pruned:
        if _finish(study, trial, say, {"reason": pruned.reason}, state=TrialState.PRUNED):
            say(f"trial {trial.number}: pruned ({pruned.reason}) [{shown}]")
    except TrialFailed as failed:
        # A write to a trial another process finished fails the run (UpdateFinishedTrialError
        # in run_trial): _finish tells that from a failure of its own.
        if _finish(study, trial, say, {"reason": failed.reason}, state=TrialState.FAIL):
            say(f"trial {trial.number}: failed: {failed.reason} [{shown}]")
        if isinstance(failed, DeviceFailed):
            raise DeviceUnusable.at(
                "",
                f"trial {trial.number}",
                f"left this process's GPU unusable ({failed.reason}); every later trial of "
                "this worker would fail at once",
                f"`loom search --resume {search_dir}` continues the study in a new process; "
                "if the trial's values caused it (a class count below the data's labels), "
                "narrow the space",
            ) from failed
    except UpdateFinishedTrialError:  # finished elsewhere while its values were drawn
        say(_DROPPED.format(number=trial.number))
    except KeyboardInterrupt:
        _queue_again_if_unfinished(study, trial, say)
        raise


def _queue_again_if_unfinished(
    study: optuna.Study, trial: optuna.Trial, say: Say, error: BaseException | None = None
) -> None:
    """A trial a stop (or the worker's `error`) cut short, before its value was stored:
    failed with the reason and its parameters queued for the next run; one already finished
    stands."""
    from optuna.trial import TrialState

    reason = "interrupted (Ctrl-C, SIGTERM or SIGHUP)"
    if error is not None:
        reason = f"its worker failed: {failure_reason(error)}"
    recorded = study._storage.get_trial(trial._trial_id).state.is_finished()
    attrs = {"reason": reason, "retried": True}
    if not recorded and _finish(study, trial, say, attrs, state=TrialState.FAIL):
        queue_retry(study, trial)
        said = "interrupted" if error is None else reason
        say(f"trial {trial.number}: {said}; its parameters are queued for the next run")


_DROPPED = "trial {number}: finished by another process; this run of it is dropped"


def _finish(
    study: optuna.Study,
    trial: optuna.Trial,
    say: Say,
    attrs: dict[str, Any],
    value: float | None = None,
    **kw: Any,
) -> bool:
    """Write the ending's attributes and tell it; False, with a line, when another process
    finished the trial first, whose ending stands. That happens where two processes are handed
    one queued trial (one SQLite file without `loom search-server` in front: Optuna's own
    proxy, or several search folders on it; docs/search.md), or to a trial failed for a
    stopped heartbeat whose process then went on."""
    from optuna.exceptions import UpdateFinishedTrialError

    try:
        for key, attr in attrs.items():
            trial.set_user_attr(key, attr)
        _tell(study, trial, value, **kw)
        return True
    except (UpdateFinishedTrialError, ValueError) as error:
        # tell's own look at the trial ("Cannot tell a COMPLETE trial."), before it writes;
        # not a ValueError of the sampler's after_trial, which comes after ours is stored.
        refused = isinstance(error, UpdateFinishedTrialError) or str(error).startswith(
            "Cannot tell a "
        )
        if not refused or not study._storage.get_trial(trial._trial_id).state.is_finished():
            raise
    say(_DROPPED.format(number=trial.number))
    return False


def _tell(study: optuna.Study, trial: optuna.Trial, value: float | None = None, **kw: Any) -> None:
    """study.tell; the trial's state is stored even when the sampler's after_trial raises,
    as GridSampler's does outside `optimize` when its grid is used up (it calls study.stop):
    the budget of trials is ours to keep (worker loop), not the sampler's."""
    try:
        study.tell(trial, value, **kw)
    except RuntimeError as error:
        if "Study.stop" not in str(error):
            raise


def worker_device(requested: str | None, worker: int) -> str | None:
    """Worker `worker`'s device, made this process's current GPU when it is one: on a
    machine with several GPUs, no `--device` (or a bare `cuda`) gives the workers the GPUs in
    turn, one each; all of them trained on GPU 0 before, the others idle and GPU 0 out of
    memory."""
    import torch

    device = requested
    if requested in (None, "cuda") and torch.cuda.is_available():
        count = torch.cuda.device_count()
        device = f"cuda:{worker % count}" if count > 1 else requested
    if device is not None and device.startswith("cuda:"):
        # What a bare `cuda` means in this process (pinned memory, the broken-GPU check of
        # trial.gpu_answers): else GPU 0, and a context there for nothing.
        torch.cuda.set_device(device)
    return device


def short_names(keys: list[str]) -> dict[str, str]:
    """Each dotted key's shortest ending that tells it from the others and names a key, not
    only list positions: `lr`, `normal.0.1` (a DARTS edge's, where `1` said nothing)."""
    names = {}
    for key in keys:
        parts = key.split(".")
        for size in range(1, len(parts) + 1):
            name = ".".join(parts[-size:])
            named = not parts[-size].isdigit()
            if named and not any(o != key and (o == name or o.endswith("." + name)) for o in keys):
                break
        names[key] = name
    return names


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
