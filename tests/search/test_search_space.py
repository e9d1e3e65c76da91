"""Search spaces: reading, sampling, and every bad space refused before any trial with the
parameter, its file:line and a suggestion (exit 2, nothing written)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from search_helpers import tiny_config

from torchloom.cli.main import main
from torchloom.config import LoadedConfig, load_config
from torchloom.errors import ConfigError
from torchloom.search.checking import check_values, overrides_for, read_space, yaml_value
from torchloom.search.settings import read_settings
from torchloom.search.space import SearchSpace

SEARCH_LR = "search:\n  training.optimizer.lr: {loguniform: [1.0e-4, 1.0e-2]}\n"


def _space(tmp_path: Path, data: Path, search: str) -> tuple[Path, LoadedConfig, SearchSpace]:
    config = tiny_config(tmp_path, data, search)
    loaded = load_config(config)
    return config, loaded, read_space(loaded, None)


def _error(tmp_path: Path, data: Path, search: str) -> str:
    with pytest.raises(ConfigError) as caught:
        config, loaded, space = _space(tmp_path, data, search)
        read_settings(space, {})
        check_values(config, [], loaded, space)
    return caught.value.format()


def test_a_space_samples_each_distribution_and_its_conditions(
    tmp_path: Path, mnist_folder: Path
) -> None:
    search = """\
search:
  sampler: random
  training.optimizer.lr: {loguniform: [1.0e-5, 1.0e-1]}
  training.optimizer.weight_decay:
    uniform: [0.0, 0.1]
    when: {pipeline.image_classifier.type: LeNet5}
  training.dataloader.batch_size: {int: [16, 64], step: 16}
  training.optimizer.type: {choice: [Adam, SGD]}
  training.optimizer.momentum: {uniform: [0.5, 0.9], when: {training.optimizer.type: SGD}}
  pipeline.image_classifier.globals: {choice: [{prediction_size: num_classes}]}
"""
    _, loaded, space = _space(tmp_path, mnist_folder, search)
    # `momentum` follows `type`, the parameter its condition names.
    order = list(space.parameters)
    assert order.index("training.optimizer.type") < order.index("training.optimizer.momentum")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(20):
        values = space.sample(study.ask(), loaded.data)
        assert 1e-5 <= values["training.optimizer.lr"] <= 1e-1
        assert values["training.dataloader.batch_size"] in (16, 32, 48, 64)
        assert values["pipeline.image_classifier.globals"] == {"prediction_size": "num_classes"}
        kind = values["training.optimizer.type"]
        assert ("training.optimizer.momentum" in values) == (kind == "SGD")
        # weight_decay's condition is on the config's own value (LeNet5): always holds.
        assert "training.optimizer.weight_decay" in values
        seen.add(kind)
    assert seen == {"Adam", "SGD"}


def test_trial_values_become_overrides_the_config_reader_reads_back() -> None:
    assert yaml_value(1e-05) == "1.0e-05"
    assert yaml_value([64, 32]) == "[64, 32]"
    assert yaml_value("a b") == '"a b"'
    assert overrides_for({"training.seed": 3}) == ["++training.seed=3"]


@pytest.mark.parametrize(
    ("search", "expected"),
    [
        (
            "  training.optimizer.lr: {uniform: [0.1, 0.01]}",
            "tiny.yml:14: search parameter 'training.optimizer.lr': low 0.1 is greater than "
            "high 0.01",
        ),
        (
            "  training.optimizer.lr: {loguniform: [0, 0.1]}",
            "tiny.yml:14: search parameter 'training.optimizer.lr': a log range must be above 0",
        ),
        (
            "  training.optimiser.lr: {uniform: [0.1, 0.2]}",
            "names no key of the config ('training.optimiser' does not exist) "
            "(did you mean 'optimizer'?)",
        ),
        (
            "  training.optimizer.lr: {loguniforn: [0.1, 0.2]}",
            "names no distribution (did you mean 'loguniform'?)",
        ),
        (
            "  training.optimizer.lr: {uniform: [0.1, 0.2], when: {pipeline.clasifier.type: X}}",
            "its condition names 'pipeline.clasifier.type', neither a search parameter nor a "
            "key of the config",
        ),
        (
            "  training.dataloader.batch_size: {int: [0, 32]}",
            "tiny.yml:14: search parameter 'training.dataloader.batch_size': value 0 is refused",
        ),
        (
            "  training.optimizer.type: {choice: [Adam, Adamm]}",
            "search parameter 'training.optimizer.type': value 'Adamm' is refused",
        ),
        (
            "  samplr: tpe\n  training.optimizer.lr: {uniform: [0.1, 0.2]}",
            "tiny.yml:14: search setting 'samplr': unknown setting (search parameters are "
            "dotted config keys) (did you mean 'sampler'?)",
        ),
        (
            "  pruner: percentile\n  training.optimizer.lr: {uniform: [0.1, 0.2]}",
            "search setting 'pruner': PercentilePruner.__init__() missing 1 required positional "
            "argument: 'percentile'",
        ),
        (
            "  pruner: {type: median, n_warmup_steps: -1}\n"
            "  training.optimizer.lr: {uniform: [0.1, 0.2]}",
            "search setting 'pruner': Number of warmup steps cannot be negative",
        ),
        (
            "  training.optimizer.lr: {loguniform: [1.0e-4, 1.0], step: 1}",
            "search parameter 'training.optimizer.lr': step and a log scale cannot be combined",
        ),
        (
            "  sampler: {type: tpe, n_startup: 3}\n  training.optimizer.lr: {uniform: [0.1, 0.2]}",
            "search setting 'sampler.n_startup': is no argument of TPESampler "
            "(did you mean 'n_startup_trials'?)",
        ),
        (
            "  sampler: grid\n  training.optimizer.lr: {uniform: [0.1, 0.2]}",
            "is a continuous range, which the grid sampler",
        ),
        (  # a list of 10^12 values (a MemoryError traceback), or 10^9 points never started
            "  sampler: grid\n  training.seed: {int: [0, 1000000000000]}",
            "search space: makes a grid of 1e+12 points, more than the 1,000,000 a search can "
            "try ('training.seed' alone has 1,000,000,000,001 values)",
        ),
        (  # ran 2 trials without a word
            "  trials: 2.5\n  training.optimizer.lr: {uniform: [0.1, 0.2]}",
            "search setting 'trials': must be whole, got 2.5",
        ),
        # Optuna's samplers are built when the settings are read: their own checks failed
        # each trial (its values "could not be drawn"), or the first one after the search
        # folder was made, in a traceback.
        (
            "  sampler: {type: qmc, qmc_type: bogus}\n"
            "  training.optimizer.lr: {uniform: [0.1, 0.2]}",
            "tiny.yml:14: search setting 'sampler': The `qmc_type='bogus'` is invalid",
        ),
        (
            "  sampler: {type: tpe, n_startup_trials: abc}\n"
            "  training.optimizer.lr: {uniform: [0.1, 0.2]}",
            "search setting 'sampler.n_startup_trials': must be int, got 'abc'",
        ),
        (  # 15 GB at each trial
            "  sampler: {type: tpe, n_ei_candidates: 2000000000}\n"
            "  training.optimizer.lr: {uniform: [0.1, 0.2]}",
            "search setting 'sampler.n_ei_candidates': must be at most 10,000 "
            "(MAX_SAMPLER_SIZES), got 2000000000",
        ),
        (
            "  sampler: {type: nsga2, population_size: 1000000000}\n"
            "  training.optimizer.lr: {uniform: [0.1, 0.2]}",
            "search setting 'sampler.population_size': must be at most 10,000",
        ),
        (
            "  sampler: {type: evolution, population_size: 1000000000, sample_size: 1000000000}\n"
            "  training.optimizer.lr: {uniform: [0.1, 0.2]}",
            "search setting 'sampler.population_size': must be at most 10,000",
        ),
        (
            "  sampler: {type: tpe, n_startup_trials: -3}\n"
            "  training.optimizer.lr: {uniform: [0.1, 0.2]}",
            "search setting 'sampler.n_startup_trials': must be at least 0, got -3",
        ),
        (  # a sampler object, which no config can give
            "  sampler: {type: qmc, independent_sampler: random}\n"
            "  training.optimizer.lr: {uniform: [0.1, 0.2]}",
            "search setting 'sampler.independent_sampler': takes a Python object "
            "(BaseSampler | None), which a config cannot give",
        ),
        (
            "  sampler: {type: cmaes, sigma0: -1}\n  training.optimizer.lr: {uniform: [0.1, 0.2]}",
            "search setting 'sampler.sigma0': must be above 0, got -1",
        ),
    ],
)
def test_a_bad_space_names_the_parameter_and_its_line(
    tmp_path: Path, mnist_folder: Path, search: str, expected: str
) -> None:
    assert expected in _error(tmp_path, mnist_folder, f"search:\n{search}\n")


def test_loom_search_and_check_refuse_a_bad_space_before_any_trial(
    tmp_path: Path, mnist_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    search = "search:\n  training.optimizer.lr: {loguniform: [-1, 0.1]}\n"
    config = tiny_config(tmp_path, mnist_folder, search)
    runs = tmp_path / "runs"
    assert main(["search", str(config), "--trials", "2", "--expdir", str(runs)]) == 2
    error = capsys.readouterr().err
    assert "tiny.yml:14: search parameter 'training.optimizer.lr'" in error
    assert not runs.exists()  # nothing written
    assert main(["check", str(config)]) == 2
    assert "a log range must be above 0" in capsys.readouterr().err


def test_a_space_file_is_read_with_its_own_lines(tmp_path: Path, mnist_folder: Path) -> None:
    config = tiny_config(tmp_path, mnist_folder)
    space_file = tmp_path / "space.yml"
    space_file.write_text(
        "pruner: median\ntraining.optimizer.lr: {loguniform: [1.0e-4, 0.1]}\n"
        "training.dataloader.batch_size: {int: [64, 16]}\n"
    )
    with pytest.raises(ConfigError) as caught:
        read_space(load_config(config), space_file)
    assert "space.yml:3: search parameter 'training.dataloader.batch_size'" in str(caught.value)


def test_a_config_with_a_search_section_still_trains_and_checks(
    tmp_path: Path, mnist_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    search = "search:\n  training.optimizer.lr: {loguniform: [1.0e-4, 0.1]}\n"
    config = tiny_config(tmp_path, mnist_folder, search)
    assert main(["check", str(config)]) == 0
    assert "search: ok, sampler tpe: training.optimizer.lr (loguniform" in capsys.readouterr().out


def test_a_sampler_whose_package_is_missing_is_refused_before_any_trial(
    tmp_path: Path,
    mnist_folder: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Optuna's CmaEsSampler imports cmaes only at its second trial: without it, a search
    crashed there with a traceback, its trial left running and no results written."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "cmaes" else real(name, *a)
    )
    config = tiny_config(tmp_path, mnist_folder, SEARCH_LR)
    runs = tmp_path / "runs"
    command = ["search", str(config), "--trials", "2", "--sampler", "cmaes"]
    assert main([*command, "--expdir", str(runs)]) == 2
    error = capsys.readouterr().err
    assert "the cmaes sampler needs the package cmaes" in error and "command line" in error
    assert not runs.exists()


def test_a_cmaes_search_runs_its_trials(tmp_path: Path, mnist_folder: Path) -> None:
    config = tiny_config(tmp_path, mnist_folder, SEARCH_LR)
    runs = tmp_path / "runs"
    command = ["search", str(config), "--trials", "3", "--sampler", "cmaes", "--seed", "0"]
    assert main([*command, "--expdir", str(runs)]) == 0
    (folder,) = (runs / "searches").glob("*/*")
    rows = (folder / "trials.csv").read_text(encoding="utf-8").splitlines()[1:]
    assert len(rows) == 3 and all(",complete," in row for row in rows)


def test_the_default_mode_minimises_every_loss_the_reports_rank_as_lower_is_better() -> None:
    """A pipeline with two losses reports `loss_a` and `loss_b` (mnist/2lenet5_2losses.yml):
    the search maximised them, where the run table and comparisons rank them lower is
    better."""
    from torchloom.search.runner import monitor_of

    data = {"validation": {}}
    for monitor in ("validation.loss_a", "validation.loss_std", "training.loss", "val.mse"):
        assert monitor_of(data, monitor, None, set()) == (monitor, "min")
    for monitor in ("validation.accuracy", "validation.bleu"):
        assert monitor_of(data, monitor, None, set()) == (monitor, "max")
    assert monitor_of(data, "validation.loss_a", "max", set()) == ("validation.loss_a", "max")


def test_a_continuous_range_on_a_whole_number_key_is_refused_before_any_trial(
    tmp_path: Path, mnist_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its ends 16.0 and 64.0 passed the schema (whole numbers), `loom check` said ok, and
    every trial failed on a value such as 63.955."""
    search = "search:\n  training.dataloader.batch_size: {uniform: [16, 64]}\n"
    config = tiny_config(tmp_path, mnist_folder, search)
    assert main(["check", str(config)]) == 2
    error = capsys.readouterr().err
    assert "search parameter 'training.dataloader.batch_size'" in error
    assert "search it with int: [16, 64]" in error
    runs = tmp_path / "runs"
    assert main(["search", str(config), "--trials", "2", "--expdir", str(runs)]) == 2
    assert not runs.exists()


def test_progress_lines_name_each_parameter_by_an_ending_that_tells_it_apart() -> None:
    """The last key part alone printed a DARTS edge's `normal.0.1` as `1=...` and two
    `lr`s alike."""
    from torchloom.search.worker import short_names

    keys = [
        "pipeline.net.genotype.normal.0.0",
        "pipeline.net.genotype.normal.0.1",
        "pipeline.net.genotype.reduce.0.0",
        "pipeline.net.channels",
        "training.optimizer.lr",
        "pipeline.head.lr",
    ]
    assert list(short_names(keys).values()) == [
        "normal.0.0",
        "normal.0.1",
        "reduce.0.0",
        "channels",
        "optimizer.lr",
        "head.lr",
    ]
