"""One translator of pydantic validation errors (errors.validation_problems) and the
one-statement form of a user error (LoomError.at): every problem at once, each at its key's
line, with what was received and the closest known key."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import torchloom
from torchloom.cli.main import main
from torchloom.errors import DataError, Problem

SOURCE = Path(torchloom.__file__).parent
LENET5 = SOURCE / "configs" / "mnist" / "lenet5.yml"


def test_an_error_of_one_problem_in_one_statement_is_the_error_of_its_list() -> None:
    short = DataError.at("a.yml:3", "sampler", "is empty", "choose more indices")
    long = DataError([Problem("a.yml:3", "sampler", "is empty", "choose more indices")])
    assert short.problems == long.problems
    assert str(short) == str(long) == "data error: a.yml:3: sampler: is empty (choose more indices)"


def _is_problem_literal(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Problem"


def test_no_user_error_of_one_problem_is_raised_through_a_list() -> None:
    """The one-statement form is the only one: `raise X([Problem(...)])` does not come back
    (a list of one problem built elsewhere, `raise X([problem])`, is not this pattern)."""
    long_forms = []
    for path in SOURCE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
                continue
            first = node.exc.args[0] if node.exc.args else None
            one = first.elts if isinstance(first, ast.List) else []
            if len(one) == 1 and _is_problem_literal(one[0]):
                long_forms.append(f"{path.relative_to(SOURCE)}:{node.lineno}")
    assert long_forms == []


def test_validation_errors_are_translated_in_one_place() -> None:
    """Only errors.py reads a pydantic ValidationError's items."""
    readers = [
        str(path.relative_to(SOURCE))
        for path in SOURCE.rglob("*.py")
        if ".errors()" in path.read_text()
    ]
    assert readers == ["errors.py"]


def _check(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> str:
    config = tmp_path / "bad.yml"
    config.write_text(text)
    assert main(["check", str(config)]) == 2
    return capsys.readouterr().err


SECTION_PROBLEMS = """\
pipeline:
  net: {type: LeNet5}
training:
  task: {type: MNIST}
  optimiser: {type: Adam}
  dataloader:
    batch_size: many
    shuffel: true
"""


def test_every_problem_of_a_section_is_reported_at_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _check(tmp_path, SECTION_PROBLEMS, capsys)
    assert "3 problems" in err
    assert "bad.yml:5: key 'training.optimiser': unknown key (did you mean 'optimizer'?)" in err
    assert "bad.yml:7: key 'training.dataloader.batch_size'" in err and "(got 'many')" in err
    assert (
        "bad.yml:8: key 'training.dataloader.shuffel': unknown key (did you mean 'shuffle'?)" in err
    )


def test_a_missing_parameter_of_a_component_is_named_at_the_component(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _check(
        tmp_path,
        "pipeline:\n  net:\n    type: FeedForwardNetwork\n    dropuot: 0.5\n"
        "training:\n  task: {type: MNIST}\n",
        capsys,
    )
    assert "component 'net' (FeedForwardNetwork): unknown parameter 'dropuot'" in err
    assert "did you mean 'dropout'?" in err


def test_analysis_settings_say_what_was_received(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _check(
        tmp_path,
        f"default_configs: [{LENET5}]\nanalysis:\n  roc: maybe\n  worst_sampels: 3\n",
        capsys,
    )
    assert "bad.yml:3: key 'analysis.roc'" in err and "(got 'maybe')" in err
    assert "bad.yml:4: key 'analysis.worst_sampels': unknown key" in err
    assert "did you mean 'worst_samples'?" in err


def test_control_characters_of_a_config_reach_the_terminal_as_escapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key or a name holding an escape sequence (`\\x1b[2J` clears the screen, `\\x1b]0;...`
    retitles it) was printed raw in the error and in `loom check`'s table."""
    config = tmp_path / "ansi.yml"
    config.write_text(
        'default_configs: [loom://mnist/lenet5.yml]\nname: "ansi\\e[2J"\n'
        'training:\n  "bad\\e[41mKEY": 1\n'
    )
    assert main(["check", str(config)]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "bad\\x1b[41mKEY" in err
    config.write_text('default_configs: [loom://mnist/lenet5.yml]\nname: "ansi\\e[2J"\n')
    assert main(["check", str(config)]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "holds a control character" in err
