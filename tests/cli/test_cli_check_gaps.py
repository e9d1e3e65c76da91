"""User errors that `loom check` once let through or reported badly (each was a strict xfail
naming the bug, now fixed), and a `loom train` that must leave nothing behind for a rejected
config.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from loom_cli_harness import (
    GOOD_CONFIG,
    GOOD_PIPELINE,
    INCLUDE_DEFAULTS,
    assert_user_error,
    run_loom,
    write_config,
)

CHECK_ACCEPTS = (
    "BUG: `loom check` exits 0 for this config although `loom train` rejects it as a config "
    "error before training: the training section's optimizer, scheduler, loss_weights, "
    "param_groups and early_stopping.monitor are only checked when `loom train` sets up"
)

# (extra YAML appended to the good config, texts the error must name)
TRAINING_MISTAKES = {
    "unknown-optimizer-type": (
        "training:\n  optimizer: {type: Adamm}\n",
        ("bad.yml:", "'Adamm'", "did you mean 'Adam'"),
    ),
    "misspelt-optimizer-argument": (
        "training:\n  optimizer: {lrr: 0.1}\n",
        ("bad.yml:", "lrr", "did you mean 'lr'?"),
    ),
    "unknown-scheduler-type": (
        "training:\n  scheduler: {type: StepLRR, step_size: 2}\n",
        ("bad.yml:", "'StepLRR'", "did you mean 'StepLR'"),
    ),
    "unknown-inner-scheduler-type": (
        "training:\n  scheduler:\n    type: SequentialLR\n    milestones: [2]\n"
        "    schedulers:\n      - {type: LinearLR}\n      - {type: CosineAnealingLR}\n",
        ("bad.yml:", "schedulers[1].type 'CosineAnealingLR'", "did you mean 'CosineAnnealingLR'"),
    ),
    "compile-option-misspelt": (
        "training:\n  compile: {modee: reduce-overhead}\n",
        ("bad.yml:", "training.compile.modee", "did you mean 'mode'"),
    ),
    "compile-mode-unknown": (
        "training:\n  compile: {mode: fastest}\n",
        ("bad.yml:", "training.compile.mode", "'fastest'", "reduce-overhead"),
    ),
    "cuda-graphs-with-gradient-accumulation": (
        "training:\n  compile: {mode: reduce-overhead}\n  gradient_accumulation: 2\n",
        ("bad.yml:", "training.gradient_accumulation", "CUDA graphs", "compile: true"),
    ),
    "loss-weights-name-no-loss": (
        "training:\n  loss_weights: {nlloss: 2.0}\n",
        ("bad.yml:", "'nlloss'", "did you mean 'nllloss'?"),
    ),
    "param-groups-name-no-component": (
        "training:\n  optimizer: {param_groups: {image_clasifier: {lr: 0.1}}}\n",
        ("bad.yml:", "'image_clasifier'", "did you mean 'image_classifier'?"),
    ),
    "early-stopping-monitor-names-no-statistic": (
        "training:\n  terminal_conditions:\n    early_stopping: {monitor: validation.acuracy}\n",
        ("bad.yml:", "'validation.acuracy'", "did you mean 'validation.accuracy'?"),
    ),
}


@pytest.mark.parametrize(
    ("extra", "culprits"), list(TRAINING_MISTAKES.values()), ids=list(TRAINING_MISTAKES)
)
def test_check_rejects_what_train_rejects(
    extra: str,
    culprits: tuple[str, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bad = write_config(tmp_path, GOOD_CONFIG + extra)
    monkeypatch.chdir(tmp_path)
    assert_user_error(run_loom(capsys, "check", str(bad)), *culprits)


TRAIN_MISTAKES = {
    "unknown-component-type": (
        GOOD_CONFIG.replace("type: LeNet5", "type: LeNet"),
        ("bad.yml:4", "did you mean 'LeNet5'?"),
    ),
    "unknown-optimizer-type": (
        GOOD_CONFIG + "training:\n  optimizer: {type: Adamm}\n",
        ("bad.yml:", "'Adamm'", "did you mean 'Adam'"),
    ),
    "loss-weights-name-no-loss": (
        GOOD_CONFIG + "training:\n  loss_weights: {nlloss: 2.0}\n",
        ("bad.yml:", "'nlloss'", "did you mean 'nllloss'?"),
    ),
    "early-stopping-monitor-names-no-statistic": (
        GOOD_CONFIG
        + "training:\n  terminal_conditions:\n    early_stopping: {monitor: validation.acuracy}\n",
        ("bad.yml:", "'validation.acuracy'", "did you mean 'validation.accuracy'"),
    ),
    "no-epoch-or-episode-limit": (
        GOOD_CONFIG + "training:\n  terminal_conditions: {epoch_limit: null}\n",
        ("bad.yml:", "epoch_limit"),
    ),
}


@pytest.mark.parametrize(
    ("text", "culprits"), list(TRAIN_MISTAKES.values()), ids=list(TRAIN_MISTAKES)
)
def test_train_writes_nothing_for_a_rejected_config(
    text: str,
    culprits: tuple[str, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    configs, work = tmp_path / "configs", tmp_path / "work"
    configs.mkdir()
    work.mkdir()
    bad = write_config(configs, text)
    monkeypatch.chdir(work)
    result = run_loom(capsys, "train", str(bad), "--device", "cpu", "--quiet")
    assert_user_error(result, *culprits)
    assert sorted(str(p.relative_to(work)) for p in work.rglob("*")) == []


def test_section_that_is_not_a_mapping_names_the_users_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write_config(tmp_path, GOOD_CONFIG + "training: 5\n")
    monkeypatch.chdir(tmp_path)
    result = run_loom(capsys, "check", str(bad))
    assert_user_error(result, "bad.yml:8", "'training'", "must be a mapping")


def test_section_that_is_not_a_mapping_without_includes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write_config(tmp_path, "training: 5\n" + GOOD_PIPELINE)
    monkeypatch.chdir(tmp_path)
    result = run_loom(capsys, "check", str(bad))
    assert_user_error(result, "bad.yml:1", "section 'training'", "must be a mapping")


def test_model_as_task_over_defaults_says_it_is_not_a_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write_config(
        tmp_path, INCLUDE_DEFAULTS + "test:\n  task: {type: LeNet5}\n" + GOOD_PIPELINE
    )
    monkeypatch.chdir(tmp_path)
    result = run_loom(capsys, "check", str(bad))
    assert_user_error(result, "bad.yml:3", "'test.task' (LeNet5)", "not a task")


def test_check_refuses_on_device_for_a_task_that_builds_samples_one_by_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`loom check` passed `on_device` for a text task, which `loom train` then refused: the
    task's class says it without reading any data."""
    override = "++validation.dataloader.on_device=true"
    result = run_loom(capsys, "check", "loom://language/bbc_news_bow_ffn.yml", override)
    assert_user_error(result, "validation.dataloader.on_device", "TextClassification", "one by one")


def test_tasks_refused_for_their_parameters_are_said_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """SortOfCLEVR tasks given `subset` (they have `images`) were followed by seven "needs global
    ..., which no component publishes" problems, one per reader of the globals they would have
    published: noise after the one mistake."""
    subsets = [f"+{section}.task.subset=100" for section in ("training", "validation", "test")]
    result = run_loom(capsys, "check", "loom://vqa/sort_of_clevr_cnn_rn.yml", *subsets)
    assert_user_error(result, "3 problems", "unknown parameter 'subset' of SortOfCLEVR")
    assert "no component publishes" not in result.err
