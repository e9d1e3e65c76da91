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
