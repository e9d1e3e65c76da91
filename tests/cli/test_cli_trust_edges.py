"""`loom check` at the edges of what a config may ask for (issue #14): overrides of keys the
schema knows, override values torch refuses (blamed on the override, with what is expected),
`type: module:Class` naming a module that raises on import, and classes that could not run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from loom_cli_harness import GOOD_CONFIG, assert_user_error, run_loom, write_config

# ---- overrides ------------------------------------------------------------------------------


def test_a_key_the_schema_knows_is_set_without_plus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, GOOD_CONFIG, "good.yml")
    overrides = ("training.seed=7", "training.terminal_conditions.episode_limit=30")
    assert run_loom(capsys, "check", str(config), *overrides).status == 0
    shown = run_loom(capsys, "config", str(config), *overrides)
    assert shown.status == 0, shown.err
    assert "  seed: 7\n" in shown.out and "    episode_limit: 30\n" in shown.out


def test_a_key_outside_the_schemas_still_needs_plus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, GOOD_CONFIG, "good.yml")
    result = run_loom(
        capsys, "check", str(config), "training.optimizer.momentum=0.9", "training.sed=7"
    )
    assert_user_error(
        result,
        "To add a new key write '+training.optimizer.momentum=0.9'",
        "'training' has no key 'sed' (did you mean 'seed'?",
    )


@pytest.mark.parametrize(
    ("override", "culprits"),
    [
        (
            "training.optimizer.lr=abc",
            ("expected a number, got 'abc'", "lr must be a number >= 0"),
        ),
        (
            "training.optimizer.lr=-0.1",
            ("Adam refuses -0.1: Invalid learning rate: -0.1", "lr must be a number >= 0"),
        ),
        (
            "+training.optimizer.betas=[0.9, 1.5]",
            ("Adam refuses [0.9, 1.5]", "betas must be two numbers, each in [0, 1)"),
        ),
        (
            "+training.optimizer.amsgrad=maybe",
            ("expected true or false, got 'maybe'", "Adam's default is False"),
        ),
        (
            # torch checks the constructor's arguments only: a group's rate was never checked
            "+training.optimizer.param_groups={image_classifier: {lr: -1}}",
            ("param_groups.image_classifier.lr", "Adam refuses -1", "lr must be a number >= 0"),
        ),
    ],
)
def test_a_value_torch_refuses_is_blamed_on_the_override(
    override: str, culprits: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, GOOD_CONFIG, "good.yml")
    result = run_loom(capsys, "check", str(config), override)
    assert_user_error(result, f"command-line override '{override}'", *culprits)
    assert "default_mnist.yml" not in result.err  # the line it replaced is not the culprit
    assert "not supported between instances" not in result.err


def test_a_value_in_a_file_is_blamed_on_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, GOOD_CONFIG + "training:\n  optimizer: {lr: -0.5}\n")
    result = run_loom(capsys, "check", str(config))
    assert_user_error(result, "bad.yml:9: training.optimizer.lr: Adam refuses -0.5")
