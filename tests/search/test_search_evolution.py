"""`--sampler evolution` (regularized evolution, Real et al. 2019) and search.html's Pareto
front: the population ages as the algorithm says, a child changes one parameter of the
tournament's winner, bad settings are refused at `loom check`, and a real search records
each trial's size and draws the front (seen in headless Chromium where it is installed)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from search_helpers import tiny_config

from torchloom.analysis.plotting import png_data
from torchloom.cli.main import main
from torchloom.search.evolution_sampler import ORIGIN, RegularizedEvolutionSampler
from torchloom.search.pareto import PARAMETERS, ParameterCount, front, section
from torchloom.search.record import read_record
from torchloom.search.results import open_study
from torchloom.zoo.nas.search_network import DartsNetwork

CHROMIUM = Path("/usr/bin/chromium")
OPERATIONS = ["sep_conv_3x3", "max_pool_3x3", "skip_connect", "dil_conv_3x3"]


def evolve(population: int, sample: int, trials: int, seed: int = 0) -> optuna.Study:
    """A study of `trials` trials on a toy space of 6 'edges' (4 operations each) and one
    input choice. Trial 0 is by far the fittest, so an algorithm that kept the fittest (not
    the youngest) would breed from it for ever."""
    study = optuna.create_study(
        direction="maximize", sampler=RegularizedEvolutionSampler(population, sample, seed)
    )

    def objective(trial: optuna.Trial) -> float:
        ops = [trial.suggest_categorical(f"edge{i}", OPERATIONS) for i in range(6)]
        source = trial.suggest_categorical("input", [0, 1, 2])
        fitness = sum(op == "sep_conv_3x3" for op in ops) + 0.1 * source
        return 100.0 if trial.number == 0 else fitness

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study.optimize(objective, n_trials=trials)
    return study


def test_the_population_ages_and_the_tournament_picks_the_fittest_of_its_sample() -> None:
    population, sample, trials = 5, 3, 40
    study = evolve(population, sample, trials)
    history = study.trials  # one process: trial t completed before trial t + 1 was asked
    parents = []
    for trial in history:
        origin = trial.system_attrs[ORIGIN]
        if trial.number < population:  # the initial population: random, no parent
            assert origin["parent"] is None
            continue
        # The population at this trial's birth: the `population` most recent trials.
        alive = set(range(trial.number - population, trial.number))
        assert set(origin["sample"]) <= alive and len(origin["sample"]) == sample
        fitness = {n: history[n].value for n in origin["sample"]}
        assert origin["parent"] in origin["sample"]
        assert fitness[origin["parent"]] == max(fitness.values())
        parents.append(origin["parent"])
        # The child is the parent with exactly one parameter changed.
        parent = history[origin["parent"]]
        changed = [k for k in trial.params if trial.params[k] != parent.params[k]]
        assert changed == [origin["mutated"]]
    # Trial 0 (value 100, the best ever) dies after `population` younger ones complete: only
    # trial `population` could breed from it; removing the worst instead would keep it.
    assert all(parent != 0 for parent in parents[1:])
    assert study.best_trial.number == 0
    # Evolution improves on the random initial population (6 sep_conv edges is the top).
    initial = max(t.value for t in history[1:population])
    assert max(t.value for t in history[population:]) > initial


@pytest.mark.parametrize(
    "suggest",
    [
        lambda trial: trial.suggest_int("depth", 1, 4, log=True),
        lambda trial: trial.suggest_float("dropout", 0.0, 0.3, step=0.1),
        lambda trial: trial.suggest_int("width", 1, 100_000),
        lambda trial: trial.suggest_float("lr", 1e-4, 1e-1, log=True),
    ],
    ids=["log int", "stepped float", "wide int", "log float"],
)
def test_a_mutated_number_always_changes(suggest: object) -> None:
    """A log int was drawn again at random and came back unchanged in about a third of the
    children (the docs promise a changed value); so did stepped floats."""
    study = optuna.create_study(
        direction="maximize", sampler=RegularizedEvolutionSampler(3, 2, seed=0)
    )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study.optimize(lambda trial: float(suggest(trial)), n_trials=40)  # type: ignore[operator]
    for trial in study.trials[3:]:
        parent = study.trials[trial.system_attrs[ORIGIN]["parent"]]
        assert trial.params != parent.params, trial.number


def test_a_seeded_evolution_repeats_itself() -> None:
    first = [t.params for t in evolve(4, 2, 15, seed=7).trials]
    assert first == [t.params for t in evolve(4, 2, 15, seed=7).trials]
    assert first != [t.params for t in evolve(4, 2, 15, seed=8).trials]


def test_mutating_a_range_draws_another_value() -> None:
    sampler = RegularizedEvolutionSampler(2, 2, seed=0)
    study = optuna.create_study(sampler=sampler)
    study.optimize(lambda t: t.suggest_int("n", 1, 3) + t.suggest_float("x", 0, 1), n_trials=12)
    for trial in study.trials[2:]:
        origin = trial.system_attrs[ORIGIN]
        parent = study.trials[origin["parent"]]
        name = origin["mutated"]
        assert trial.params[name] != parent.params[name]
        other = "x" if name == "n" else "n"
        assert trial.params[other] == parent.params[other]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("{type: evolution, population_size: 1}", "need population_size >= 2"),
        ("{type: evolution, population_size: 4, sample_size: 5}", "1 <= sample_size"),
        ("{type: evolution, populaton_size: 4}", "did you mean 'population_size'"),
        ("evolutoin", "did you mean 'evolution'"),
    ],
)
def test_bad_evolution_settings_fail_loom_check(
    tmp_path: Path,
    mnist_folder: Path,
    capsys: pytest.CaptureFixture[str],
    setting: str,
    message: str,
) -> None:
    search = f"search:\n  sampler: {setting}\n  training.optimizer.lr: {{choice: [0.001, 0.01]}}\n"
    config = tiny_config(tmp_path, mnist_folder, search)
    assert main(["check", str(config)]) == 2
    assert message in capsys.readouterr().err


def test_front_keeps_the_best_at_each_size() -> None:
    study = optuna.create_study(direction="maximize")
    points = [(0.90, 5000), (0.85, 3000), (0.80, 4000), (0.95, 9000), (0.70, 1000), (0.94, 9500)]
    for value, size in points:
        trial = study.ask()
        trial.set_user_attr(PARAMETERS, size)
        study.tell(trial, value)
    kept = front(study.trials, "max")
    assert [(t.value, t.user_attrs[PARAMETERS]) for t in kept] == [
        (0.70, 1000),
        (0.85, 3000),
        (0.90, 5000),
        (0.95, 9000),
    ]
    assert [t.user_attrs[PARAMETERS] for t in front(study.trials, "min")] == [1000]


def test_a_trial_that_searches_an_architecture_records_no_size(tmp_path: Path) -> None:
    """Its trainable weights are the supernet's (every candidate operation on every edge),
    not the derived network's: a Pareto "size" of the same few hundred thousand for every
    trial, whatever it derives. No size is recorded and the page says why."""
    shape = {"input_depth": 1, "input_height": 8, "input_width": 8, "prediction_size": 3}
    darts = DartsNetwork.create(cells=3, channels=4, steps=2, multiplier=2, globals=shape)
    run = SimpleNamespace(pipeline=SimpleNamespace(components={"net": darts}, models=[darts]))
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    ParameterCount(trial).before_train(run)  # type: ignore[arg-type]
    study.tell(trial, 0.5)
    assert PARAMETERS not in study.trials[0].user_attrs
    shown = "".join(section(tmp_path, study, "validation.accuracy", "max"))
    assert "Not drawn: 1 trial(s) recorded no size" in shown and "searches an architecture" in shown
    assert not (tmp_path / "plots").exists()


FFN_SEARCH = """\
default_configs: [loom://mnist/ffn.yml]
name: tiny_ffn
training:
  task: {{data_folder: {data}, subset: 256}}
  dataloader: {{batch_size: 32}}
  seed: 3
  terminal_conditions: {{epoch_limit: 1}}
validation:
  task: {{subset: 64}}
test:
  task: {{subset: 64}}
search:
  sampler: {{type: evolution, population_size: 3, sample_size: 2}}
  # Items of a list, by position: the network's two hidden layers.
  pipeline.classifier.hidden_sizes.0: {{choice: [16, 32, 64]}}
  pipeline.classifier.hidden_sizes.1: {{choice: [8, 16]}}
  training.optimizer.lr: {{choice: [0.001, 0.003]}}
"""


def ffn_size(first: int, second: int) -> int:
    return 784 * first + first + first * second + second + second * 10 + 10


@pytest.mark.slow
def test_an_evolution_search_records_sizes_and_draws_the_front(
    tmp_path: Path, mnist_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real `loom search --sampler evolution` over the widths of a feed-forward network."""
    config = tmp_path / "ffn_search.yml"
    config.write_text(FFN_SEARCH.format(data=mnist_folder), encoding="utf-8")
    expdir = tmp_path / "runs"
    code = main(["search", str(config), "--trials", "6", "--seed", "1", "--expdir", str(expdir)])
    assert code == 0, capsys.readouterr().err
    (search_dir,) = (expdir / "searches" / "tiny_ffn").iterdir()
    study = open_study(search_dir, read_record(search_dir))
    trials = study.trials
    assert len(trials) == 6 and all(t.state.name == "COMPLETE" for t in trials)
    assert [t.system_attrs[ORIGIN]["parent"] is None for t in trials] == [True] * 3 + [False] * 3
    for trial in trials:  # each trial's size, recorded when its run started
        first = trial.params["pipeline.classifier.hidden_sizes.0"]
        second = trial.params["pipeline.classifier.hidden_sizes.1"]
        assert trial.user_attrs[PARAMETERS] == ffn_size(first, second)
        assert f"hidden_sizes:\n    - {first}\n    - {second}\n" in trial.user_attrs["config"]
    page = (search_dir / "search.html").read_text()
    assert "Pareto front: validation.accuracy against trainable parameters" in page
    drawn = png_data(search_dir / "plots" / "pareto.png")
    assert sorted(point[0] for point in drawn["points"]) == list(range(6))
    assert drawn["front"] == [t.number for t in front(trials, "max")] != []
    if CHROMIUM.exists():
        shown = chromium_dom(search_dir / "search.html", tmp_path)
        assert "Pareto front" in shown
        images = shown.count("<img")
        assert images >= 2 and f'data-images-loaded="{images}/{images}"' in shown


def chromium_dom(page: Path, tmp_path: Path) -> str:
    probe = tmp_path / "probe.html"
    script = """<script>window.addEventListener("load", () => {
  const images = [...document.images];
  const loaded = images.filter((i) => i.complete && i.naturalWidth > 0).length;
  document.body.setAttribute("data-images-loaded", loaded + "/" + images.length);
});</script>"""
    probe.write_text(page.read_text().replace("</body>", script + "</body>"))
    command = [
        str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", "--virtual-time-budget=5000",
        probe.as_uri(),
    ]  # fmt: skip
    shown = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    return shown.stdout
