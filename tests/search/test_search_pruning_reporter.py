"""What the pruner hears from a run: the monitored statistic after each full validation (step:
completed epochs), or in online mode after every validation (step: episodes); a pruned trial
asks its run to stop once."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest

from torchloom.search.trial import Objective, PruningReporter


class FakeRun:
    def __init__(self, online: bool) -> None:
        self.online = online
        self.progress = SimpleNamespace(epoch=0, episode=0)
        self.log = logging.getLogger("test")
        self.stops = 0
        self.reasons: list[str | None] = []

    def request_stop(self, reason: str | None = None) -> None:
        self.stops += 1
        self.reasons.append(reason)


def _reporter(pruner: Any) -> tuple[optuna.Trial, PruningReporter]:
    study = optuna.create_study(direction="maximize", pruner=pruner)
    trial = study.ask()
    return trial, PruningReporter(trial, Objective("validation.accuracy", "max"))


def test_full_validations_are_reported_by_epoch_and_partial_ones_skipped() -> None:
    trial, reporter = _reporter(optuna.pruners.NopPruner())
    run = FakeRun(online=False)
    for epoch, accuracy in ((1, 0.5), (2, 0.7), (3, 0.6)):
        run.progress.epoch, run.progress.episode = epoch, 10 * epoch
        reporter.after_eval(run, "validation", {"accuracy": accuracy - 0.1}, partial=True)
        reporter.after_eval(run, "validation", {"accuracy": accuracy}, partial=False)
        reporter.after_eval(run, "test", {"accuracy": 1.0}, partial=False)
    frozen = trial.study.trials[0]
    assert frozen.intermediate_values == {1: 0.5, 2: 0.7, 3: 0.6}
    assert reporter.best == 0.7 and run.stops == 0  # the value told is the best one


def test_online_validations_are_reported_by_episode() -> None:
    trial, reporter = _reporter(optuna.pruners.NopPruner())
    run = FakeRun(online=True)
    for episode in (25, 50):
        run.progress.episode = episode
        reporter.after_eval(run, "validation", {"accuracy": episode / 100}, partial=True)
    assert trial.study.trials[0].intermediate_values == {25: 0.25, 50: 0.5}


def test_a_pruned_trial_asks_its_run_to_stop_once() -> None:
    _, reporter = _reporter(optuna.pruners.ThresholdPruner(lower=0.9))
    run = FakeRun(online=False)
    for epoch in (1, 2):
        run.progress.epoch = epoch
        reporter.after_eval(run, "validation", {"accuracy": 0.5}, partial=False)
    assert reporter.pruned_at == 1 and run.stops == 1
    assert run.reasons == ["pruned by the search at step 1"]  # the run ends `stopped`


def test_a_full_validation_at_the_episode_of_a_partial_one_is_told_once_without_a_warning(
    recwarn: pytest.WarningsRecorder,
) -> None:
    trial, reporter = _reporter(optuna.pruners.NopPruner())
    run = FakeRun(online=True)
    run.progress.episode = 50
    reporter.after_eval(run, "validation", {"accuracy": 0.4}, partial=True)
    reporter.after_eval(run, "validation", {"accuracy": 0.6}, partial=False)  # the epoch's end
    assert trial.study.trials[0].intermediate_values == {50: 0.4}
    assert not [w for w in recwarn if "already reported" in str(w.message)]


def test_asking_for_a_trial_with_heartbeats_warns_nothing(
    tmp_path: Path, recwarn: pytest.WarningsRecorder
) -> None:
    """The worker asks for each trial and runs its heartbeat itself (worker.work): Optuna's
    "supposed to be used with Study.optimize" was printed at every trial on a database."""
    from torchloom.search.study import create_study, load_study

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    create_study(url, "beating", {"monitor": "m", "direction": "maximize", "digest": "d"})
    load_study(url, "beating", None, None).ask()
    assert not [w for w in recwarn if "Heartbeat" in str(w.message)]


def test_an_online_trial_s_value_is_its_full_pass_not_its_luckiest_partial_one() -> None:
    """A partial pass reads a few batches: a trial whose one partial pass read 0.8 and whose
    full pass at the end read 0.6 was worth 0.8 (its best of both). `loom runs` ranks an
    online run by its full pass; so does the search now. Offline, the best epoch counts."""
    _, reporter = _reporter(optuna.pruners.NopPruner())
    run = FakeRun(online=True)
    for episode, accuracy in ((25, 0.3), (50, 0.8)):
        run.progress.episode = episode
        reporter.after_eval(run, "validation", {"accuracy": accuracy}, partial=True)
    run.progress.episode = 60
    reporter.after_eval(run, "validation", {"accuracy": 0.6}, partial=False)
    assert reporter.value() == 0.6
    _, offline = _reporter(optuna.pruners.NopPruner())
    run = FakeRun(online=False)
    for epoch, accuracy in ((1, 0.7), (2, 0.6)):
        run.progress.epoch = epoch
        offline.after_eval(run, "validation", {"accuracy": accuracy}, partial=False)
    assert offline.value() == 0.7
