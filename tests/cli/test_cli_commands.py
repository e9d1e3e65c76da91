"""What `loom check`, `loom config` and `loom components` print when all is well, and the
round trips they promise: `loom config` output passes `loom check` as it is, and the YAML
snippet of `loom components NAME` pasted into a pipeline passes `loom check`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from loom_cli_harness import (
    GOOD_PIPELINE,
    INCLUDE_DEFAULTS,
    MNIST_CONFIGS,
    assert_user_error,
    run_loom,
    write_config,
)

LENET5 = MNIST_CONFIGS / "lenet5.yml"
CONVNET = MNIST_CONFIGS / "convnet.yml"


def _rows(table: str) -> dict[str, str]:
    """Table line by its first cell (component or section name)."""
    return {line.split()[0]: line for line in table.splitlines() if line.strip()}


# ---- loom check -----------------------------------------------------------------------------
def test_check_prints_the_pipeline_table(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_loom(capsys, "check", str(LENET5))
    assert result.status == 0, result.err
    assert result.err == ""
    rows = _rows(result.out)
    assert result.out.startswith("pipeline 'lenet5' (")
    for header in ("component", "type", "inputs -> outputs", "params", "state"):
        assert header in rows["component"]
    lenet = rows["image_classifier"]
    assert "LeNet5" in lenet
    assert "inputs [batch, 1, 28, 28] -> predictions [batch, classes=10]" in lenet
    assert "61,706" in lenet and lenet.rstrip().endswith("trainable")
    assert "NLLLoss" in rows["nllloss"] and "-> loss []" in rows["nllloss"]
    assert "AccuracyStatistics" in rows["accuracy"]
    assert "inputs [batch, 1, 28, 28]" in rows["training.task"]
    assert "parameters: 61,706 trainable, 0 frozen" in result.out
    assert "num_classes=10" in result.out
    assert "handshake: ok (training, validation, test)" in result.out


def test_check_convnet_shows_renamed_streams_and_globals(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = run_loom(capsys, "check", str(CONVNET))
    assert result.status == 0, result.err
    rows = _rows(result.out)
    assert "feature_maps [batch, 16, 1, 1] -> feature_vectors [batch, 16]" in rows["reshaper"]
    assert "feature_vectors [batch, 16] -> predictions [batch, classes=10]" in rows["classifier"]
    assert "feature_vector_size=16" in result.out


def test_check_disable_and_freeze(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_loom(
        capsys,
        "check",
        str(LENET5),
        "+pipeline.image_classifier.freeze=true",
        "--disable",
        "accuracy",
        # the default early stopping watches validation.accuracy, which would go with it
        "training.terminal_conditions.early_stopping.monitor=validation.loss",
    )
    assert result.status == 0, result.err
    rows = _rows(result.out)
    assert "accuracy" not in rows
    assert rows["image_classifier"].rstrip().endswith("frozen")
    assert "parameters: 0 trainable, 61,706 frozen" in result.out


def test_check_applies_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_loom(
        capsys,
        "check",
        str(LENET5),
        "+training.task.resize=[32, 32]",
        "+validation.task.resize=[32,32]",
        "+test.task.resize=[32,32]",
    )
    assert result.status == 0, result.err
    assert "inputs [batch, 1, 32, 32] -> predictions" in _rows(result.out)["image_classifier"]


def test_overrides_may_follow_options(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_loom(
        capsys,
        "check",
        str(LENET5),
        "--disable",
        "accuracy",
        "training.optimizer.lr=0.01",
        "training.terminal_conditions.early_stopping.monitor=validation.loss",
    )
    assert result.status == 0, result.err


# ---- loom config ----------------------------------------------------------------------------
@pytest.mark.parametrize("config", [LENET5, CONVNET], ids=lambda p: p.name)
def test_config_output_passes_check_as_it_is(
    config: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    dumped = run_loom(capsys, "config", str(config))
    assert dumped.status == 0, dumped.err
    assert "default_configs" not in dumped.out, "the output is merged: no includes left"
    assert "${" not in dumped.out, "the output is resolved: no interpolations left"
    saved = write_config(tmp_path, dumped.out, config.name)

    original = run_loom(capsys, "check", str(config))
    again = run_loom(capsys, "check", str(saved))
    assert again.status == 0, again.err
    # The same pipeline: every line of the table but the first (which names the file).
    assert again.out.splitlines()[1:] == original.out.splitlines()[1:]
    # And dumping the dump changes nothing.
    assert run_loom(capsys, "config", str(saved)).out == dumped.out


def test_config_applies_overrides_and_the_result_still_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    dumped = run_loom(
        capsys,
        "config",
        str(LENET5),
        "training.optimizer.lr=1e-2",
        "+pipeline.image_classifier.dropout=0.25",
        "~pipeline.accuracy",
        "training.terminal_conditions.early_stopping.monitor=validation.loss",
    )
    assert dumped.status == 0, dumped.err
    assert re.search(r"^    lr: 0\.01$", dumped.out, re.MULTILINE), dumped.out
    assert "dropout: 0.25" in dumped.out
    assert "AccuracyStatistics" not in dumped.out
    saved = write_config(tmp_path, dumped.out, "overridden.yml")
    checked = run_loom(capsys, "check", str(saved))
    assert checked.status == 0, checked.err
    assert "accuracy" not in _rows(checked.out)


def test_config_reports_user_errors_like_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    broken = write_config(tmp_path, "default_configs: [nowhere.yml]\n", "broken.yml")
    assert_user_error(run_loom(capsys, "config", str(broken)), "broken.yml:1", "nowhere.yml")
    syntax = write_config(tmp_path, "pipeline: [a,\n", "syntax.yml")
    assert_user_error(run_loom(capsys, "config", str(syntax)), "syntax.yml:2:1", "YAML syntax")
    result = run_loom(capsys, "config", str(LENET5), "training.optimizer.lrr=1")
    assert_user_error(result, "'training.optimizer.lrr=1'", "did you mean 'lr'?")
    assert result.out == ""
    # A key added with `+` that no schema has: printed as a config, which check refused.
    result = run_loom(capsys, "config", str(LENET5), "+training.bogus=1")
    assert_user_error(result, "training.bogus")
    assert result.out == ""


# ---- loom components ------------------------------------------------------------------------
FAMILIES = {
    "tasks": ["MNIST"],
    "models": ["ConvNetEncoder", "FeedForwardNetwork", "LeNet5"],
    "statistics": ["AccuracyStatistics"],
    "utilities": ["ReshapeTensor"],
}


def _sections(text: str) -> dict[str, str]:
    """The listing cut at its family headers (a line alone before a 'name description' head)."""
    lines = text.splitlines()
    sections: dict[str, str] = {}
    for i, line in enumerate(lines[:-1]):
        if lines[i + 1].startswith("name ") and line and " " not in line:
            end = next((j for j in range(i + 1, len(lines)) if not lines[j].strip()), len(lines))
            sections[line] = "\n".join(lines[i + 2 : end])
    return sections


def test_components_lists_every_family(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_loom(capsys, "components")
    assert result.status == 0, result.err
    sections = _sections(result.out)
    for family, names in FAMILIES.items():
        assert family in sections, (family, list(sections))
        listed = {line.split()[0] for line in sections[family].splitlines()}
        assert set(names) <= listed, (family, listed)
    assert "LeNet-5 (LeCun et al. 1998)" in result.out  # the docstring's first line
    assert "`loom components NAME`" in result.out


def test_components_heads_the_loss_family_losses(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_loom(capsys, "components")
    sections = _sections(result.out)
    assert "losses" in sections, list(sections)
    assert {"NLLLoss", "CrossEntropyLoss"} <= {
        line.split()[0] for line in sections["losses"].splitlines()
    }


def test_components_describes_lenet5(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_loom(capsys, "components", "LeNet5")
    assert result.status == 0, result.err
    out = result.out
    assert out.startswith("LeNet5 (model)")
    assert "padding (int, default 2): Zero padding" in out
    assert "dropout (float, default 0.0): Dropout probability" in out
    assert "log_softmax (bool, default True)" in out
    needed = out.split("globals needed:")[1].split("globals published:")[0]
    for name in ("input_depth", "input_height", "input_width", "prediction_size"):
        assert f"  {name}: " in needed
    snippet = out.split("config snippet (pipeline entry):")[1]
    assert "my_lenet5:" in snippet and "type: LeNet5" in snippet
    # Pasted as it was, it failed the handshake wherever the globals had other names.
    assert "globals: {prediction_size: NAME_PUBLISHED}" in snippet


def test_components_lenet5_shows_its_streams(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_loom(capsys, "components", "LeNet5")
    assert "input streams" in result.out
    assert re.search(r"^  inputs: \[batch, ", result.out, re.MULTILINE), result.out
    assert re.search(r"^  predictions: \[batch, ", result.out, re.MULTILINE), result.out


DESCRIBED = [
    "MNIST",
    "LeNet5",
    "ConvNetEncoder",
    "FeedForwardNetwork",
    "ReshapeTensor",
    "NLLLoss",
    "CrossEntropyLoss",
    "AccuracyStatistics",
]


@pytest.mark.parametrize("name", DESCRIBED)
def test_components_describes_every_built_in(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_loom(capsys, "components", name)
    assert result.status == 0, result.err
    assert result.out.startswith(f"{name} (")
    for part in ("parameters:", "globals needed:", "config snippet (pipeline entry):"):
        assert part in result.out
    assert f"type: {name}" in result.out.split("config snippet (pipeline entry):")[1]


def test_components_unknown_name_suggests(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_loom(capsys, "components", "LeNt5")
    assert_user_error(result, "'LeNt5'", "did you mean 'LeNet5'?")


def _snippet(capsys: pytest.CaptureFixture[str], name: str) -> str:
    result = run_loom(capsys, "components", name)
    assert result.status == 0, result.err
    return result.out.split("config snippet (pipeline entry):\n")[1].strip()


@pytest.mark.parametrize(
    ("name", "replaces"),
    [("NLLLoss", "nllloss"), ("CrossEntropyLoss", "nllloss"), ("AccuracyStatistics", "accuracy")],
)
def test_pasted_snippet_passes_check(
    name: str,
    replaces: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The snippet, pasted under `pipeline:` in place of the entry it replaces, key renamed."""
    snippet = _snippet(capsys, name)
    key = f"my_{name.lower()}:"
    entry = [line for line in snippet.splitlines() if not line.startswith("#")]
    assert entry[0].startswith(key), snippet  # after its comment on globals, if any
    pasted = "\n".join("  " + line for line in snippet.replace(key, f"{replaces}:", 1).splitlines())
    lines = [line for line in GOOD_PIPELINE.splitlines() if not line.startswith(f"  {replaces}:")]
    config = INCLUDE_DEFAULTS + "\n".join(lines) + "\n" + pasted + "\n"
    if name == "CrossEntropyLoss":  # raw logits for it
        config = config.replace("type: LeNet5", "type: LeNet5\n    log_softmax: false")
    path = write_config(tmp_path, config, "pasted.yml")
    monkeypatch.chdir(tmp_path)
    result = run_loom(capsys, "check", str(path))
    assert result.status == 0, config + result.err
    assert name in _rows(result.out)[replaces]


def test_pasted_lenet5_snippet_passes_check_with_its_globals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    snippet = _snippet(capsys, "LeNet5").replace("my_lenet5:", "image_classifier:", 1)
    config = (
        INCLUDE_DEFAULTS
        + "pipeline:\n"
        + "\n".join("  " + line for line in snippet.splitlines())
        + "\n  nllloss: {type: NLLLoss}\n"
        # the MNIST defaults stop early on validation.accuracy
        + "  accuracy: {type: AccuracyStatistics}\n"
    )
    path = write_config(tmp_path, config, "pasted.yml")
    monkeypatch.chdir(tmp_path)
    # LeNet5 reads `prediction_size`; MNIST publishes `num_classes`: the rename is the user's.
    result = run_loom(
        capsys, "check", str(path), "+pipeline.image_classifier.globals.prediction_size=num_classes"
    )
    assert result.status == 0, config + result.err
