"""`loom search` in this process, on real MNIST images: the search folder, best.yml training
the best trial again, failed and pruned trials recorded with their reason."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from search_helpers import tiny_config

import torchloom
from torchloom.cli.main import main


def _search_dir(runs: Path) -> Path:
    (found,) = (runs / "searches").glob("*/*")
    return found


def _rows(search_dir: Path) -> list[dict[str, str]]:
    with open(search_dir / "trials.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def test_search_writes_trials_best_config_importance_and_page(
    tmp_path: Path, mnist_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    search = """\
search:
  sampler: random
  training.optimizer.lr: {loguniform: [1.0e-4, 1.0e-2]}
  training.dataloader.batch_size: {choice: [16, 32]}
"""
    config = tiny_config(tmp_path, mnist_folder, search)
    runs = tmp_path / "runs"
    assert main(["search", str(config), "--trials", "3", "--seed", "1", "--expdir", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "best: trial" in out
    found = _search_dir(runs)
    rows = _rows(found)
    assert [r["state"] for r in rows] == ["complete"] * 3
    assert {r["number"] for r in rows} == {"0", "1", "2"}
    for row in rows:  # each trial's own run folder, inside the search folder
        summary = json.loads((found / row["run_dir"] / "summary.json").read_text())
        assert summary["status"] == "epoch_limit"
        assert float(row["validation.accuracy"]) == summary["monitor"]["best"]
    best = max(rows, key=lambda r: float(r["validation.accuracy"]))
    # best.yml is the best trial's config: training it again gives the same value.
    again = torchloom.train(found / "best.yml", expdir=str(tmp_path / "again"), tensorboard=0)
    assert again.summary["monitor"]["best"] == float(best["validation.accuracy"])
    importance = json.loads((found / "importance.json").read_text())
    assert set(importance["importance"]) == {
        "training.optimizer.lr",
        "training.dataloader.batch_size",
    }
    page = (found / "search.html").read_text()
    assert page.count("<img") >= 4 and "best.yml" in page
    for name in ("history", "slice", "intermediate", "parallel", "importance"):
        assert (found / "plots" / f"{name}.png").is_file(), name


def test_failed_and_pruned_trials_keep_their_reason_and_never_end_the_study(
    tmp_path: Path, mnist_folder: Path
) -> None:
    # A huge rate diverges (a user error, recorded as failed); the threshold pruner stops
    # every trial below 99% accuracy after its first epoch.
    search = """\
search:
  sampler: grid
  pruner: {type: threshold, lower: 0.99}
  training.optimizer.lr: {choice: [1.0e-3, 1.0e+12]}
"""
    config = tiny_config(tmp_path, mnist_folder, search, epochs=2)
    runs = tmp_path / "runs"
    assert main(["search", str(config), "--expdir", str(runs)]) == 0
    rows = {r["training.optimizer.lr"]: r for r in _rows(_search_dir(runs))}
    assert len(rows) == 2  # the grid's size when --trials is not given
    diverged, pruned = rows["1000000000000.0"], rows["0.001"]
    assert diverged["state"] == "fail" and "diverged" in diverged["reason"]
    assert pruned["state"] == "pruned" and pruned["reason"] == "pruned at step 1"
    run_dir = _search_dir(runs) / pruned["run_dir"]
    summary = json.loads((run_dir / "summary.json").read_text())
    # Stopped at the end of the epoch the pruner saw, not one step into the next; and said
    # so: not "interrupted ... resume with --resume", which is what a Ctrl-C leaves.
    assert (summary["epochs"], summary["episodes"]) == (1, 256 // 32)
    assert summary["status"] == "stopped" and summary["reason"] == "pruned by the search at step 1"
    assert "--resume" not in (run_dir / "run.log").read_text()
    # Its curves are in search.html and its CSV files; no PNG is drawn for a pruned run.
    assert (run_dir / "validation_epoch_statistics.csv").is_file()
    assert not list((run_dir / "reports").rglob("*.png"))


def test_a_trial_the_pruner_stops_at_its_last_step_is_complete(
    tmp_path: Path, mnist_folder: Path
) -> None:
    """The pruner's verdict after the last epoch stops nothing: the run ends by its own limit
    (status epoch_limit, its test pass and pictures done). It was recorded `pruned`, its value
    left out of the study, while its run folder said it had finished."""
    search = """\
search:
  sampler: grid
  pruner: {type: threshold, lower: 0.99}
  training.optimizer.lr: {choice: [1.0e-3]}
"""
    config = tiny_config(tmp_path, mnist_folder, search, epochs=1)
    runs = tmp_path / "runs"
    assert main(["search", str(config), "--expdir", str(runs)]) == 0
    (row,) = _rows(_search_dir(runs))
    summary = json.loads((_search_dir(runs) / row["run_dir"] / "summary.json").read_text())
    assert summary["status"] == "epoch_limit"
    assert row["state"] == "complete"
    assert float(row["validation.accuracy"]) == summary["monitor"]["best"] < 0.99


def test_a_resumed_search_runs_only_the_missing_trials(tmp_path: Path, mnist_folder: Path) -> None:
    search = "search:\n  training.optimizer.lr: {loguniform: [1.0e-4, 1.0e-2]}\n"
    config = tiny_config(tmp_path, mnist_folder, search)
    runs = tmp_path / "runs"
    argv = ["search", str(config), "--trials", "1", "--sampler", "random", "--seed", "0"]
    assert main([*argv, "--expdir", str(runs)]) == 0
    found = tmp_path / "moved"  # a search folder can be moved, then resumed
    shutil.move(_search_dir(runs), found)
    assert main(["search", "--resume", str(found), "--trials", "2"]) == 0
    rows = _rows(found)
    assert [r["number"] for r in rows] == ["0", "1"]
    # A seeded sampler does not draw the first session's values again.
    assert rows[0]["training.optimizer.lr"] != rows[1]["training.optimizer.lr"]
    assert main(["search", "--resume", str(found), "--trials", "2"]) == 0  # nothing left
    assert len(_rows(found)) == 2


def test_a_sampler_seeded_in_the_config_draws_new_values_in_a_resumed_session(
    tmp_path: Path, mnist_folder: Path
) -> None:
    """`sampler: {type: random, seed: 0}` skipped the per-session (and per-worker) offset
    that `--seed` gets: a resumed session, or each of K workers, drew the same values."""
    search = (
        "search:\n  sampler: {type: random, seed: 0}\n"
        "  training.optimizer.lr: {loguniform: [1.0e-4, 1.0e-2]}\n"
    )
    config = tiny_config(tmp_path, mnist_folder, search)
    runs = tmp_path / "runs"
    assert main(["search", str(config), "--trials", "1", "--expdir", str(runs)]) == 0
    assert main(["search", "--resume", str(_search_dir(runs)), "--trials", "2"]) == 0
    rows = _rows(_search_dir(runs))
    assert rows[0]["training.optimizer.lr"] != rows[1]["training.optimizer.lr"]


def test_a_seeded_search_draws_each_trial_from_its_number(
    tmp_path: Path, mnist_folder: Path
) -> None:
    """Two machines sharing a study, started at the same moment with the same --seed, drew
    the same values: each worker offset the seed by the trials it saw at its start, which
    both saw alike. Trial k's values now follow from the seed and k alone (its number is
    its own under the ask lock): one session of two trials draws what two sessions of one
    do, and the two trials differ."""
    search = "search:\n  sampler: random\n  training.optimizer.lr: {loguniform: [1.0e-4, 1.0e-2]}\n"
    config = tiny_config(tmp_path, mnist_folder, search)
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["search", str(config), "--trials", "2", "--seed", "3", "--expdir", str(one)]) == 0
    assert main(["search", str(config), "--trials", "1", "--seed", "3", "--expdir", str(two)]) == 0
    assert main(["search", "--resume", str(_search_dir(two)), "--trials", "2"]) == 0

    def drawn(runs: Path) -> list[str]:
        rows = sorted(_rows(_search_dir(runs)), key=lambda r: int(r["number"]))
        return [r["training.optimizer.lr"] for r in rows]

    assert drawn(one) == drawn(two)
    assert len(set(drawn(one))) == 2


def test_every_process_of_a_seeded_qmc_search_scrambles_alike() -> None:
    """QMC takes the next point of one scrambled sequence, counted in the study: a seed per
    trial (or per worker, as before) would mix points of different sequences."""
    from torchloom.search.settings import SearchSettings
    from torchloom.search.study import make_sampler

    settings = SearchSettings(sampler={"type": "qmc"})
    seeds = {make_sampler(settings, None, 5, number)._seed for number in (0, 1, 7)}
    assert seeds == {5}
    random_sampler = SearchSettings(sampler={"type": "random"})
    first, second = (make_sampler(random_sampler, None, 5, n) for n in (0, 1))
    assert first._rng.rng.random() != second._rng.rng.random()


def test_a_sampled_config_refused_at_its_start_is_a_failed_trial(
    tmp_path: Path, mnist_folder: Path
) -> None:
    # Each value passes alone (checked before any trial on the config's Adam); SGD with
    # `amsgrad` is refused by the optimizer when that trial starts: failed, nothing trained.
    search = """\
search:
  sampler: grid
  training.optimizer.type: {choice: [SGD, Adam]}
  training.optimizer.amsgrad: {choice: [true]}
"""
    config = tiny_config(tmp_path, mnist_folder, search)
    runs = tmp_path / "runs"
    assert main(["search", str(config), "--expdir", str(runs)]) == 0
    rows = {r["training.optimizer.type"]: r for r in _rows(_search_dir(runs))}
    assert rows["SGD"]["state"] == "fail" and "amsgrad" in rows["SGD"]["reason"]
    assert rows["SGD"]["run_dir"] == ""  # refused before a run folder was made
    assert rows["Adam"]["state"] == "complete"


def test_no_trial_starts_after_the_timeout(
    tmp_path: Path, mnist_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    search = "search:\n  training.optimizer.lr: {loguniform: [1.0e-4, 1.0e-2]}\n"
    config = tiny_config(tmp_path, mnist_folder, search)
    runs = tmp_path / "runs"
    argv = ["search", str(config), "--trials", "5", "--timeout", "0.001", "--expdir", str(runs)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "--timeout reached; no new trial starts" in out and "no trial completed" in out
    assert (_search_dir(runs) / "search.html").is_file()


def test_an_importance_asked_for_is_kept_for_the_report(
    tmp_path: Path, mnist_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--importance fanova` ranks with fANOVA, and `loom report` of the folder ranks with it
    again (it rewrote importance.json with PED-ANOVA)."""
    search = "search:\n  training.optimizer.lr: {loguniform: [1.0e-4, 1.0e-2]}\n"
    config = tiny_config(tmp_path, mnist_folder, search)
    runs = tmp_path / "runs"
    command = ["search", str(config), "--trials", "3", "--expdir", str(runs)]
    assert main([*command, "--importance", "fanova"]) == 0
    found = _search_dir(runs)
    assert json.loads((found / "importance.json").read_text())["evaluator"] == "fanova"
    assert main(["report", str(found)]) == 0
    assert json.loads((found / "importance.json").read_text())["evaluator"] == "fanova"
    capsys.readouterr()
    elsewhere = tmp_path / "elsewhere"
    assert main([*command[:-1], str(elsewhere), "--importance", "anova"]) == 2
    assert "unknown importance evaluator 'anova'" in capsys.readouterr().err
    assert not elsewhere.exists()


def test_loom_search_whose_trial_breaks_its_gpu_writes_what_finished_and_exits_2(
    tmp_path: Path,
    mnist_folder: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`loom search` after a trial broke its process's GPU (torch's accelerator error, made
    here in the first training step): the trial fails with its reason, trials.csv is written,
    and the command exits 2 saying how to go on, without starting the next trials."""
    import torch

    import torchloom.search.trial as trial_module
    from torchloom.engine.trainer import TrainingLoop

    def broken(self: object, batch: object) -> None:
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(TrainingLoop, "train_step", broken)
    monkeypatch.setattr(trial_module, "gpu_answers", lambda: False)  # the GPU is gone
    search = "search:\n  training.optimizer.lr: {loguniform: [1.0e-4, 1.0e-2]}\n"
    config = tiny_config(tmp_path, mnist_folder, search)
    runs = tmp_path / "runs"
    assert main(["search", str(config), "--trials", "3", "--expdir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert "search worker stopped: trial 0: left this process's GPU unusable" in err
    assert "illegal memory access" in err and "loom search --resume" in err
    assert [row["state"] for row in _rows(_search_dir(runs))] == ["fail"]


def test_a_stopped_trial_run_again_takes_no_place_among_the_draws() -> None:
    """Each trial's draw was seeded by its number, and the re-run of a stopped trial takes a
    number: every trial after it drew what the search left alone drew one place later, and
    the draw of the first place after the stop was never tried (another best.yml)."""
    import optuna

    from torchloom.search.study import draw_number

    study = optuna.create_study()
    study.tell(study.ask(), 0.5)  # trial 0
    stopped = study.ask()  # trial 1, stopped: failed, queued again
    study.tell(stopped, state=optuna.trial.TrialState.FAIL)
    study.enqueue_trial({"lr": 0.1}, user_attrs={"retry_of": 1})
    retried = study.ask()  # trial 2 takes the queued values
    assert retried.number == 2 and retried.user_attrs["retry_of"] == 1
    study.tell(retried, 0.4)
    trials = study.get_trials(deepcopy=False)
    assert draw_number(trials) == 2  # trial 3 draws the left-alone search's trial 2 values
    assert draw_number(trials, 2) == 2 and draw_number(trials, 1) == 1
