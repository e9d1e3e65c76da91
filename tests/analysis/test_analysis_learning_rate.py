"""Learning rates: the recorder on a run with a scheduler, the range test's rules (divergence of
the raw loss, the suggestion before it) on synthetic curves, `lr_find` (and `loom lr-find`'s
module) on a small MNIST subset, training at its suggestion, and its user errors."""

from __future__ import annotations

import csv
import functools
import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from torchloom.analysis.learning_rate import LearningRateRecorder
from torchloom.analysis.lr_find import lr_find
from torchloom.analysis.lr_range_rules import find_divergence, smoothing_window, suggest
from torchloom.analysis.plotting import png_data
from torchloom.analysis.schema import AnalysisConfig
from torchloom.cli.main import main
from torchloom.engine.setup import prepare_training
from torchloom.engine.state import TrainOptions
from torchloom.errors import ConfigError


def small_config(folder: Path, data: Path) -> Path:
    path = folder / "small.yml"
    path.write_text(
        f"""\
default_configs: [loom://mnist/lenet5.yml]
training:
  task: {{data_folder: {data}, subset: 128}}
  dataloader: {{batch_size: 32}}
  seed: 4
  logging_interval: 2
  terminal_conditions: {{epoch_limit: 2}}
validation:
  task: {{subset: 64}}
""",
        encoding="utf-8",
    )
    return path


@pytest.fixture(scope="module")
def mnist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mnist")


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory, mnist: Path) -> Path:
    return small_config(tmp_path_factory.mktemp("lr"), mnist)


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def assert_png_has_content(path: Path) -> None:
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert float(image[..., :3].std()) > 0.01, f"{path.name} is blank"


def test_recorder_follows_a_scheduler(config: Path, tmp_path: Path) -> None:
    options = TrainOptions(
        expdir=str(tmp_path),
        quiet=True,
        tensorboard=0,
        hooks=[LearningRateRecorder(AnalysisConfig())],
    )
    overrides = [
        "~training.scheduler",
        "+training.scheduler={type: StepLR, step_size: 1, gamma: 0.5}",
        "~test",
    ]
    run = prepare_training(config, overrides, options).run().run_dir
    recorded = rows(run / "reports" / "learning_rate.csv")
    # The start, then every 2 of 4 batches an epoch; the rate halves after each epoch.
    assert [int(r["episode"]) for r in recorded] == [0, 2, 4, 6, 8]
    assert [float(r["lr_group_0"]) for r in recorded] == [1e-3, 1e-3, 1e-3, 5e-4, 5e-4]
    assert [int(r["epoch"]) for r in recorded] == [0, 1, 1, 2, 2]
    assert_png_has_content(run / "reports" / "learning_rate.png")


RATES = np.logspace(-7, 1, 100)


def falling_loss(seed: int = 0) -> np.ndarray:
    """A classifier's raw loss over the default ramp: the chance loss 2.30 until ~1e-4, the
    fastest fall at 3e-3 (a logistic step in log-rate) down to 0.8, batch noise throughout."""
    noise = np.random.default_rng(seed).normal(0.0, 0.05, RATES.size)
    return 2.3 - 1.5 / (1 + np.exp(-(np.log10(RATES) - np.log10(3e-3)) * 3)) + noise


def test_a_clean_fall_has_no_divergence_and_its_steepest_point_is_suggested() -> None:
    for seed in range(5):  # batch noise alone never reads as divergence
        losses = falling_loss(seed)
        assert find_divergence(losses.tolist()) is None
        chosen = suggest(RATES.tolist(), losses.tolist(), smoothing_window(100), None)
        assert chosen.rate == pytest.approx(3e-3, rel=0.6)


@pytest.mark.parametrize(
    ("name", "after"),
    [
        # The reported case: a spike to 44.7, then the network dead at the chance loss.
        ("spike then plateau", lambda n: np.r_[44.7, np.full(n - 1, 2.30)]),
        # A dead network with no spike large enough for the ratio: 3 steps at chance.
        ("plateau", lambda n: np.full(n, 2.30)),
        ("NaN", lambda n: np.full(n, math.nan)),
        ("spike then recovery", lambda n: np.r_[9.0, np.full(n - 1, 0.9)]),
    ],
)
def test_divergence_of_the_raw_loss_and_a_suggestion_before_it(
    name: str, after: Callable[[int], np.ndarray]
) -> None:
    losses = falling_loss()
    began = 75  # at rate 0.16, past the fall
    losses[began:] = after(losses.size - began)
    divergence = find_divergence(losses.tolist())
    assert divergence is not None and divergence.began == began, name
    chosen = suggest(RATES.tolist(), losses.tolist(), smoothing_window(100), divergence)
    assert chosen.rate == pytest.approx(3e-3, rel=0.6), name
    assert chosen.step is not None and chosen.step < began


def test_no_suggestion_when_too_little_comes_before_divergence_or_nothing_falls() -> None:
    losses = [2.3, 2.3, 2.31, math.inf, 2.3]
    early = find_divergence(losses)
    assert early is not None and early.began == 3 and "inf" in early.reason
    window = smoothing_window(5)
    assert suggest(RATES[:5].tolist(), losses, window, early).rate is None
    flat = np.full(40, 2.3) + np.linspace(0, 0.1, 40)
    assert find_divergence(flat.tolist()) is None
    rising = suggest(RATES[:40].tolist(), flat.tolist(), smoothing_window(40), None)
    assert rising.rate is None and "never fell" in rising.problem


def test_a_loss_that_only_wanders_is_no_fall() -> None:
    """A ramp over rates too low to train: the loss wanders about the chance loss (2.28 to
    2.33, as an audit's 40-step ramp from 1e-8 to 1e-6 did) and its steepest wiggle was
    suggested, exit 0. A real fall of the same ramp length still is."""
    noise = np.random.default_rng(0).normal(0.0, 0.012, 40)
    wandering = 2.31 + noise + 0.01 * np.sin(np.arange(40) / 4)
    window = smoothing_window(40)
    assert find_divergence(wandering.tolist()) is None
    refused = suggest(RATES[:40].tolist(), wandering.tolist(), window, None)
    assert refused.rate is None and "never fell by more than its noise" in refused.problem
    falling = 2.31 - np.linspace(0, 0.5, 40) + noise
    assert suggest(RATES[:40].tolist(), falling.tolist(), window, None).rate is not None


def test_lr_find_on_mnist(config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Through the real command line: `loom lr-find` parses its options around the overrides.
    assert (
        main(
            [
                "lr-find",
                str(config),
                "--start-lr",
                "1e-4",
                "--end-lr",
                "1",
                "--steps",
                "20",
                "--expdir",
                str(tmp_path),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    (run,) = (tmp_path / "small").iterdir()
    assert run.name.endswith("_lr_find") and f"run folder: {run}" in printed
    summary = json.loads((run / "lr_find.json").read_text())
    assert 1e-4 <= summary["suggested_lr"] <= 1.0
    assert f"suggested learning rate: {summary['suggested_lr']:.3g}" in printed
    table = rows(run / "lr_find.csv")
    assert len(table) == summary["steps_run"] <= 20
    rates = [float(r["lr"]) for r in table]
    assert rates[0] == pytest.approx(1e-4) and all(b > a for a, b in itertools.pairwise(rates))
    if summary["steps_run"] == 20:
        assert rates[-1] == pytest.approx(1.0)
    assert any(r == pytest.approx(summary["suggested_lr"], rel=1e-6) for r in rates)
    assert_png_has_content(run / "lr_find.png")
    divergence = summary["divergence"]
    marked = divergence["lr"] if divergence else None
    assert png_data(run / "lr_find.png") == {
        "suggested_lr": summary["suggested_lr"],
        "divergence_lr": marked,
    }
    assert [int(r["diverged"]) for r in table] == [
        int(divergence is not None and step >= divergence["began_step"])
        for step in range(1, len(table) + 1)
    ]
    assert (run / "config.yaml").is_file()


def test_lr_find_user_errors_leave_no_run_folder(config: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="optimizer"):
        lr_find(config, ["training.optimizer.lrr=0.1"], expdir=tmp_path, steps=8)
    with pytest.raises(ConfigError, match="--end-lr"):
        lr_find(config, [], start_lr=1.0, end_lr=0.1, expdir=tmp_path)
    # An infinite end wrote "lr": Infinity (not JSON); a ramp shorter than the smoothing
    # window ran and then blamed --end-lr for "only 3 step(s) before it".
    with pytest.raises(ConfigError, match="--end-lr: must be finite"):
        lr_find(config, [], end_lr=math.inf, expdir=tmp_path)
    with pytest.raises(ConfigError, match="--steps: must be at least 7"):
        lr_find(config, [], steps=6, expdir=tmp_path)
    assert not any(tmp_path.iterdir())


def test_a_group_at_rate_zero_stays_frozen_through_the_ramp() -> None:
    """A first group at rate 0 (a frozen part) made every ratio 1: the frozen part ramped."""
    from torchloom.analysis.lr_find import _ramp_ratios

    assert _ramp_ratios([0.0, 1e-3, 5e-4]) == [0.0, 1.0, 0.5]
    assert _ramp_ratios([1e-3, 1e-4]) == pytest.approx([1.0, 0.1])
    assert _ramp_ratios([0.0, 0.0]) == [1.0, 1.0]


def test_training_at_the_suggested_rate_beats_chance(tmp_path: Path, mnist: Path) -> None:
    """The issue's check: the default ramp's suggestion, used for one epoch, trains. The old
    rule (steepest fall of a lagging average) suggested rates past divergence for these seeds:
    0.35, 10 and 2.3, where one epoch ends at chance (10%)."""
    config = tmp_path / "three_thousand.yml"
    config.write_text(
        f"""\
default_configs: [loom://mnist/lenet5.yml]
training:
  task: {{data_folder: {mnist}, subset: 3000}}
  dataloader: {{batch_size: 64}}
  terminal_conditions: {{epoch_limit: 1}}
validation:
  task: {{subset: 1000}}
""",
        encoding="utf-8",
    )
    options = TrainOptions(expdir=str(tmp_path), quiet=True, tensorboard=0)
    for seed in (1, 3, 5):
        seeded = [f"+training.seed={seed}"]
        found = lr_find(config, seeded, expdir=tmp_path, device="cpu")
        divergence = found.divergence
        assert divergence is None or found.suggested_lr < found.learning_rates[divergence.began]
        overrides = [*seeded, f"training.optimizer.lr={found.suggested_lr}", "~training.scheduler"]
        run = prepare_training(config, [*overrides, "~test"], options).run()
        accuracy = run.summary["final"]["validation"]["accuracy"]
        assert accuracy > 0.6, f"seed {seed}: rate {found.suggested_lr:.3g}, accuracy {accuracy}"


def test_a_ramp_that_diverges_at_once_suggests_nothing(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    arguments = ["lr-find", str(config), "--start-lr", "10", "--end-lr", "1000", "--steps", "20"]
    assert main([*arguments, "--expdir", str(tmp_path), "--device", "cpu"]) == 2
    (run,) = (tmp_path / "small").iterdir()
    error = capsys.readouterr().err
    assert "--start-lr" in error and "diverged" in error and str(run) in error
    assert "Traceback" not in error
    summary = json.loads((run / "lr_find.json").read_text())
    assert summary["suggested_lr"] is None and summary["divergence"]["began_step"] < 7
    assert png_data(run / "lr_find.png")["suggested_lr"] is None


def test_lr_find_compiles_the_models_as_loom_train_does(config: Path, tmp_path: Path) -> None:
    """`training.compile` was silently ignored by the range test, which then measured other
    steps than the run would take (under fp16 or bf16 a compiled model's numbers differ)."""
    ramp = functools.partial(lr_find, config, start_lr=1e-4, end_lr=1.0, steps=20)
    result = ramp(["+training.compile={backend: eager}"], expdir=tmp_path)
    summary = json.loads((result.run_dir / "lr_find.json").read_text())
    assert summary["compiled"] == ["image_classifier"]
    plain = ramp([], expdir=tmp_path / "plain")
    assert json.loads((plain.run_dir / "lr_find.json").read_text())["compiled"] == []
    assert result.losses == pytest.approx(plain.losses, rel=1e-5, nan_ok=True)
