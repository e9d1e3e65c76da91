"""`loom train` and `torchloom.train` end to end, on real MNIST images."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from e2e_helpers import only_run, small_config, summary

import torchloom
from torchloom.cli.main import main
from torchloom.engine.loaders import SectionLoader
from torchloom.engine.run_folder import create_run_folder
from torchloom.errors import LoomError


def test_cli_train_writes_a_complete_run_folder(
    tmp_path: Path, mnist_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = small_config(tmp_path, mnist_folder)
    status = main(["train", str(config), "--expdir", str(tmp_path / "runs"), "--quiet"])
    assert status == 0
    run = only_run(tmp_path / "runs")
    assert run.parent.name == "small"
    for name in (
        "config.yaml",
        "run.log",
        "training_statistics.csv",
        "training_epoch_statistics.csv",
        "validation_epoch_statistics.csv",
        "summary.json",
        "checkpoints/best.pt",
        "checkpoints/last.pt",
        "test_statistics.csv",
    ):
        assert (run / name).is_file(), name
    assert any((run / "tensorboard").iterdir())
    result = summary(run)
    assert result["status"] == "epoch_limit" and result["epochs"] == 2
    assert result["episodes"] == 64  # 1024 images / 32 per batch * 2 epochs
    assert result["final"]["test"]["samples"] == 256
    # Learns: 10 classes, chance is 0.1.
    assert result["final"]["validation"]["accuracy"] > 0.5
    with open(run / "training_statistics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["episode"]) for r in rows] == list(range(8, 65, 8))
    assert {
        "loss",
        "loss_min",
        "loss_max",
        "loss_std",
        "batch_size",
        "samples_per_second",
        "accuracy",
    } <= rows[0].keys()
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["training"]["seed"] == 7 and saved["name"] == "small"
    printed = capsys.readouterr().out
    assert "test accuracy" in printed and str(run) in printed
    # The saved config is a config `loom check` (and so `loom train`) accepts as it is.
    assert main(["check", str(run / "config.yaml")]) == 0


def test_python_api_train_then_process(tmp_path: Path, mnist_folder: Path) -> None:
    config = small_config(tmp_path, mnist_folder)
    result = torchloom.train(
        config, ["training.terminal_conditions.epoch_limit=1"], expdir=str(tmp_path / "runs")
    )
    assert isinstance(result, torchloom.RunResult) and result.status == "epoch_limit"
    assert result.run_dir.is_dir() and result.summary["epochs"] == 1
    processed = torchloom.process(result.run_dir, section="test")
    # The same weights (best.pt) over the same test images: the same set-level accuracy.
    assert processed.statistics["accuracy"] == pytest.approx(
        result.statistics["test"]["accuracy"], abs=1e-7
    )
    assert processed.folder.parent == result.run_dir / "process"
    assert (processed.folder / "test_statistics.csv").is_file()
    assert (processed.folder / "test_summary.json").is_file()


def test_process_evaluates_a_bf16_run_as_its_own_test_pass_did(
    tmp_path: Path, mnist_folder: Path
) -> None:
    """`loom process` evaluated in float32 whatever the run's precision, so a bf16 (or fp16)
    run's test split gave other figures than its own test pass: the same weights under other
    numbers. It now runs under the run's autocast, and its summary says which."""
    import json

    config = small_config(tmp_path, mnist_folder)
    overrides = ["training.terminal_conditions.epoch_limit=1", "+training.precision=bf16"]
    result = torchloom.train(config, overrides, expdir=str(tmp_path / "runs"))
    processed = torchloom.process(result.run_dir, section="test")
    assert processed.statistics["loss"] == pytest.approx(
        result.statistics["test"]["loss"], rel=1e-9
    )
    summary = json.loads((processed.folder / "test_summary.json").read_text())
    assert summary["precision"] == "bf16"
    # fp16 autocast is a GPU's: off one, the pass runs in float32, and says so.
    fp16 = torchloom.process(result.run_dir, ["training.precision=fp16"], section="test")
    summary = json.loads((fp16.folder / "test_summary.json").read_text())
    assert summary["precision"] == "fp32"


def test_python_api_accepts_a_pipeline_described_as_a_mapping(
    tmp_path: Path, mnist_folder: Path
) -> None:
    config = yaml.safe_load(small_config(tmp_path, mnist_folder).read_text())
    config["name"] = "from_python"
    config["training"]["terminal_conditions"]["epoch_limit"] = 1
    result = torchloom.train(config, expdir=str(tmp_path / "runs"))
    assert result.run_dir.parent.name == "from_python"


def test_a_rejected_config_writes_nothing(tmp_path: Path, mnist_folder: Path) -> None:
    config = small_config(tmp_path, mnist_folder)
    with pytest.raises(LoomError, match=r"monitor 'validation\.acuracy'"):
        torchloom.train(
            config,
            ["training.terminal_conditions.early_stopping.monitor=validation.acuracy"],
            expdir=str(tmp_path / "runs"),
        )
    assert not (tmp_path / "runs").exists()


def test_two_runs_started_in_the_same_second_get_two_folders(tmp_path: Path) -> None:
    first = create_run_folder(tmp_path, "lenet5", now=1_000_000.0)
    second = create_run_folder(tmp_path, "lenet5", now=1_000_000.0)
    tagged = create_run_folder(tmp_path, "lenet5", tag="a b/c", now=1_000_000.0)
    assert first != second and first.is_dir() and second.is_dir()
    assert second.name == first.name + "-2"
    assert tagged.name.endswith("_a-b-c")


def test_early_stopping(tmp_path: Path, mnist_folder: Path) -> None:
    config = small_config(tmp_path, mnist_folder)
    result = torchloom.train(
        config,
        [
            "training.terminal_conditions.epoch_limit=10",
            "training.terminal_conditions.early_stopping.patience=0",
            "+training.terminal_conditions.early_stopping.min_delta=1.0",  # nothing improves by 1
        ],
        expdir=str(tmp_path / "runs"),
    )
    assert result.status == "early_stopped"
    assert result.summary["epochs"] == 2
    assert result.summary["monitor"]["best_epoch"] == 1


def test_divergence_stops_within_one_step_and_keeps_best(
    tmp_path: Path, mnist_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = small_config(tmp_path, mnist_folder)
    # A sane first epoch (best.pt is saved), then the rate is multiplied by 1e12.
    status = main(
        [
            "train",
            str(config),
            "training.terminal_conditions.epoch_limit=3",
            "~training.scheduler",
            "+training.scheduler={type: StepLR, step_size: 1, gamma: 1.0e+12}",
            "--expdir",
            str(tmp_path / "runs"),
            "--quiet",
        ]
    )
    assert status == 2
    error = capsys.readouterr().err
    assert "training diverged" in error and "loss 'loss'" in error
    run = only_run(tmp_path / "runs")
    result = summary(run)
    assert result["status"] == "diverged" and "not finite" in result["reason"]
    assert 32 < result["episodes"] < 64  # stopped in epoch 2, at the step that diverged
    best = torch.load(run / "checkpoints" / "best.pt", weights_only=True)
    assert best["progress"]["epoch"] == 1
    assert all(torch.isfinite(t).all() for c in best["components"].values() for t in c.values())


def test_online_mode_validates_every_n_episodes(tmp_path: Path, mnist_folder: Path) -> None:
    config = small_config(tmp_path, mnist_folder)
    result = torchloom.train(
        config,
        [
            "+training.mode=online",
            "+validation.partial_validation_interval=10",
            "+validation.partial_validation_batches=2",
            "training.terminal_conditions.epoch_limit=1",
            "validation.dataloader.batch_size=32",
        ],
        expdir=str(tmp_path / "runs"),
    )
    with open(result.run_dir / "validation_statistics.csv", newline="") as handle:
        partial = list(csv.DictReader(handle))
    assert [int(r["episode"]) for r in partial] == [10, 20, 30]
    assert all(int(r["samples"]) == 2 * 32 for r in partial)  # 2 batches of 32
    with open(result.run_dir / "validation_epoch_statistics.csv", newline="") as handle:
        full = list(csv.DictReader(handle))
    assert len(full) == 1 and int(full[0]["samples"]) == 256


def test_kfold_rotates_the_held_out_fold(
    tmp_path: Path, mnist_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, list[set[int]]] = {"training": [], "validation": []}
    original = SectionLoader.epoch

    def recording(self: SectionLoader, epoch: int, start_batch: int = 0, *rest: Any) -> Any:
        loader = original(self, epoch, start_batch, *rest)  # sets the sampler's epoch
        seen.setdefault(self.section, []).append(set(iter(self.sampler)))
        return loader

    monkeypatch.setattr(SectionLoader, "epoch", recording)
    # validation.task stays `${training.task}` (the same images); only the samplers differ.
    config = tmp_path / "kfold_small.yml"
    config.write_text(f"""\
default_configs: [loom://mnist/kfold.yml]
training:
  task: {{data_folder: {mnist_folder}, subset: 1024}}
  dataloader: {{batch_size: 32}}
  seed: 7
  terminal_conditions: {{epoch_limit: 2}}
test:
  task: {{subset: 256}}
""")
    result = torchloom.train(config, expdir=str(tmp_path / "runs"))
    with open(result.run_dir / "validation_epoch_statistics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    # 1024 training images in 5 folds (205, 205, 205, 205, 204): validation sees the held-out
    # fold, training the other four; the fold rotates with the epoch.
    assert [int(r["samples"]) for r in rows] == [205, 205]
    assert result.summary["episodes"] == 2 * -(-(1024 - 205) // 32)
    # Each validation pass visits the fold held out of the epoch just trained on.
    (train_0, train_1), (held_0, held_1) = seen["training"], seen["validation"]
    assert held_0 != held_1
    assert not held_0 & train_0 and not held_1 & train_1
    assert held_0 | train_0 == held_1 | train_1 == set(range(1024))
    # `loom process` of last.pt visits the fold its own validation did (epoch 2's), not
    # epoch 0's, which last.pt trained on (it reported 0.725 there against 0.85 held out).
    processed = torchloom.process(result.run_dir, section="validation", checkpoint="last")
    assert seen["validation"][-1] == held_1
    final = result.summary["final"]["validation"]
    assert processed.statistics["samples"] == 205
    assert processed.statistics["accuracy"] == final["accuracy"]
    assert processed.statistics["loss"] == pytest.approx(final["loss"], rel=1e-6)
