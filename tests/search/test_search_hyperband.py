"""Hyperband is told the epochs a trial trains (the config's epoch limit), so that it judges
trials from the first one on, not only after the first trial has finished: trials that K
workers or machines run side by side before then are pruned at their rungs."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from search_helpers import tiny_config

from torchloom.config import load_config
from torchloom.search import worker
from torchloom.search.checking import read_space
from torchloom.search.settings import SearchSettings
from torchloom.search.study import make_pruner

SEARCH = "search:\n  training.optimizer.lr: {loguniform: [1.0e-4, 1.0e-2]}\n"
HYPERBAND = SearchSettings(pruner={"type": "hyperband"})


def _epochs(tmp_path: Path, mnist_folder: Path, search: str, training: str = "") -> int | None:
    """The epochs a worker tells its pruner for tiny_config (9 epochs), with `training`'s
    lines added to its training section."""
    path = tiny_config(tmp_path, mnist_folder, search, epochs=9)
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("training:\n", f"training:\n{training}", 1), encoding="utf-8")
    loaded = load_config(path)
    return worker.trial_epochs(loaded.data, read_space(loaded, None))


def _pruned_while_none_finished(pruner: optuna.pruners.BasePruner) -> list[int]:
    """Twelve trials side by side, none finished: the first is the best at epoch 1, the
    others worse; the numbers of those the pruner stops there."""
    study = optuna.create_study(study_name="side_by_side", direction="maximize", pruner=pruner)
    trials = [study.ask() for _ in range(12)]
    pruned = []
    for trial in trials:
        trial.report(0.9 if trial.number == 0 else 0.5 - 0.01 * trial.number, step=1)
        if trial.should_prune():
            pruned.append(trial.number)
    return pruned


def test_hyperband_prunes_before_any_trial_has_finished(tmp_path: Path, mnist_folder: Path) -> None:
    epochs = _epochs(tmp_path, mnist_folder, SEARCH)
    assert epochs == 9
    pruned = _pruned_while_none_finished(make_pruner(HYPERBAND, epochs))
    assert pruned and 0 not in pruned
    # Without the epochs (Optuna's "auto") nothing is judged until a trial finishes.
    assert _pruned_while_none_finished(make_pruner(HYPERBAND)) == []


def test_a_max_resource_of_the_users_own_is_kept() -> None:
    settings = SearchSettings(pruner={"type": "hyperband", "max_resource": 4})
    assert make_pruner(settings, 9)._max_resource == 4


@pytest.mark.parametrize(
    ("search", "training"),
    [
        (SEARCH + "  training.terminal_conditions.epoch_limit: {int: [2, 6]}\n", ""),
        (SEARCH + "  training.mode: {choice: [offline, online]}\n", ""),
        (SEARCH, "  mode: online\n"),  # the steps a pruner hears are episodes
    ],
)
def test_epochs_that_are_not_the_same_for_every_trial_are_left_to_optuna(
    tmp_path: Path, mnist_folder: Path, search: str, training: str
) -> None:
    assert _epochs(tmp_path, mnist_folder, search, training) is None


def test_an_episode_limit_leaves_the_epochs_unknown(tmp_path: Path, mnist_folder: Path) -> None:
    path = tiny_config(tmp_path, mnist_folder, SEARCH, epochs=9)
    text = path.read_text(encoding="utf-8").replace(
        "{epoch_limit: 9}", "{epoch_limit: 9, episode_limit: 40}"
    )
    path.write_text(text, encoding="utf-8")
    loaded = load_config(path)
    assert worker.trial_epochs(loaded.data, read_space(loaded, None)) is None


def test_the_worker_gives_its_pruner_the_epochs(
    tmp_path: Path, mnist_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torchloom

    given: list[int | None] = []

    def recording(settings: SearchSettings, epochs: int | None = None) -> object:
        given.append(epochs)
        return make_pruner(settings, epochs)

    monkeypatch.setattr(worker, "make_pruner", recording)
    config = tiny_config(tmp_path, mnist_folder, SEARCH, epochs=2)
    found = torchloom.search(
        config, trials=1, pruner="hyperband", expdir=str(tmp_path / "runs"), seed=0
    )
    assert [row["state"] for row in found.trials] == ["complete"]
    assert given == [2]
