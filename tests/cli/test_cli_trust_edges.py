"""`loom check` at the edges of what a config may ask for (issue #14): overrides of keys the
schema knows, override values torch refuses (blamed on the override, with what is expected),
`type: module:Class` naming a module that raises on import, and classes that could not run.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
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


# ---- `type: module:Class` -------------------------------------------------------------------


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path for modules the configs name; they are forgotten afterwards."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    before = set(sys.modules)
    yield folder
    for name in set(sys.modules) - before:
        if name.startswith("edge_"):
            del sys.modules[name]


@pytest.mark.parametrize(
    ("module", "body", "exception"),
    [
        ("edge_divides", "RATIO = 1 / 0\n", "ZeroDivisionError: division by zero"),
        ("edge_raises", "raise RuntimeError('no GPU here')\n", "RuntimeError: no GPU here"),
        ("edge_exits", "import sys\nsys.exit(0)\n", "SystemExit: 0"),
    ],
)
def test_a_module_that_raises_on_import_is_a_user_error(
    module: str,
    body: str,
    exception: str,
    plugins: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (plugins / f"{module}.py").write_text(body, encoding="utf-8")
    config = write_config(tmp_path, GOOD_CONFIG + f"  extra: {{type: '{module}:Thing'}}\n")
    result = run_loom(capsys, "check", str(config))
    assert_user_error(
        result,
        "bad.yml:8",
        "component 'extra'",
        f"importing module '{module}' failed: {exception}",
    )


INCOMPLETE = """
import abc

import torch

from torchloom.core.component import Component, Model, Statistic, Task
from torchloom.core.streams import StreamSpec


class NoForward(Model):
    def output_specs(self):
        return {"y": StreamSpec(None, None, "y")}


class NoItems(Task):
    def output_specs(self):
        return {"inputs": StreamSpec(("batch",), torch.float32, "x")}

    def __len__(self):
        return 3


class HalfStatistic(Statistic):
    def update(self, inputs):
        pass


class Abstract(Component, abc.ABC):
    @abc.abstractmethod
    def forward(self, inputs): ...
"""


@pytest.mark.parametrize(
    ("type_name", "missing"),
    [
        ("torchloom.core.component:Component", "is the base class of every component"),
        ("torchloom.core.component:Model", "is the base class of every model"),
        ("torchloom.core.component:Loss", "is the base class of every loss"),
        ("torchloom.core.component:Statistic", "is the base class of every statistic"),
        ("edge_incomplete:NoForward", "does not implement forward(), which every model needs"),
        (
            "edge_incomplete:HalfStatistic",
            "does not implement compute(), reset(), which every statistic needs",
        ),
        ("edge_incomplete:Abstract", "is abstract: it leaves forward unimplemented"),
    ],
)
def test_a_class_that_could_not_run_is_refused_at_build_time(
    type_name: str,
    missing: str,
    plugins: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (plugins / "edge_incomplete.py").write_text(INCOMPLETE, encoding="utf-8")
    config = write_config(tmp_path, GOOD_CONFIG + f"  extra: {{type: '{type_name}'}}\n")
    result = run_loom(capsys, "check", str(config))
    assert_user_error(result, "bad.yml:8", f"component 'extra': type '{type_name}'", missing)


@pytest.mark.parametrize(
    ("type_name", "missing"),
    [
        ("torchloom.core.component:Task", "is the base class of every task"),
        ("edge_incomplete:NoItems", "does not implement __getitem__(), which every task needs"),
    ],
)
def test_a_task_that_could_not_run_is_refused_at_build_time(
    type_name: str,
    missing: str,
    plugins: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (plugins / "edge_incomplete.py").write_text(INCOMPLETE, encoding="utf-8")
    # The data folder that the included validation and test tasks interpolate.
    text = GOOD_CONFIG + f"training:\n  task: {{type: '{type_name}', data_folder: x}}\n"
    result = run_loom(capsys, "check", str(write_config(tmp_path, text)))
    assert_user_error(result, "bad.yml:9", f"type '{type_name}'", missing)
