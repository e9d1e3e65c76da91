"""`loom check` on malformed configs: every user error exits 2, prints no traceback, names its
culprit (file and line, component, key or stream) with a "did you mean" for misspellings, and
writes nothing.

Each case is a real YAML file, usually built on the shipped MNIST defaults. The config lives in
its own folder and the command runs from another, empty one, which must still be empty after.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from loom_cli_harness import (
    GOOD_CONFIG,
    GOOD_PIPELINE,
    INCLUDE_DEFAULTS,
    Result,
    assert_user_error,
    run_loom,
    write_config,
)

DIR = "@DIR@"  # replaced by the folder that holds the case's config files


@dataclass
class Case:
    config: str | bytes | None  # None: the file is not written (a missing file)
    culprits: tuple[str, ...]
    args: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)  # other files beside the config
    name: str = "bad.yml"


def _with(old: str, new: str) -> str:
    """The good config with one edit; fails loudly if the edit no longer applies."""
    assert old in GOOD_CONFIG, old
    return GOOD_CONFIG.replace(old, new, 1)


LENET = "globals: {prediction_size: num_classes}"
NLL = "nllloss: {type: NLLLoss}"
TINY = "training:\n  task: {resize: [8, 8]}\n"

CASES: dict[str, Case] = {
    # ---- the YAML itself -------------------------------------------------------------------
    "yaml-syntax-error": Case(
        "training:\n  task: {type: MNIST\n  split: train\n",
        ("bad.yml:3:8", "YAML syntax error", "flow mapping at line 2, column 9"),
    ),
    "tab-indentation": Case(
        "training:\n\ttask: {type: MNIST}\n", ("bad.yml:2:1", "YAML syntax error", "'\\t'")
    ),
    "duplicate-key": Case(
        INCLUDE_DEFAULTS + "training:\n  seed: 1\ntraining:\n  seed: 2\n" + GOOD_PIPELINE,
        ("bad.yml:4", "key 'training'", "duplicate key", "line 2"),
    ),
    "top-level-not-a-mapping": Case(
        "- LeNet5\n- NLLLoss\n", ("bad.yml:1", "top level", "must be a mapping", "a list")
    ),
    "python-tag-refused": Case(
        GOOD_CONFIG + "name: !!python/object/apply:os.system [ls]\n",
        ("bad.yml:8:7", "python/object/apply:os.system"),
    ),
    "not-utf8": Case(b"name: caf\xe9\n", ("bad.yml", "cannot read it", "utf-8")),
    "invalid-interpolation-syntax": Case(
        GOOD_CONFIG + "name: '${training'\n",
        ("bad.yml:8", "key 'name'", "invalid interpolation", "${training"),
    ),
    # ---- files and includes ----------------------------------------------------------------
    "missing-file": Case(
        None,
        ("lenett.yml", "file not found", "did you mean 'lenet.yml'?"),
        files={"lenet.yml": GOOD_CONFIG},
        name="lenett.yml",
    ),
    "config-is-a-directory": Case(None, ("bad.yml", "is a directory"), files={"bad.yml/x": ""}),
    "missing-include": Case(
        "default_configs: [defaults/base.yml]\n" + GOOD_PIPELINE,
        ("bad.yml:1", "default_configs entry", "base.yml", "file not found"),
    ),
    "misspelt-packaged-include": Case(
        "default_configs: ['loom://mnist/default_mnis.yml']\n" + GOOD_PIPELINE,
        (
            "bad.yml:1",
            "default_mnis.yml",
            "file not found",
            "did you mean 'loom://mnist/default_mnist.yml'?",
        ),
    ),
    "include-cycle": Case(
        "default_configs: [a.yml]\n" + GOOD_PIPELINE,
        ("include cycle", "bad.yml -> a.yml -> b.yml -> bad.yml", "b.yml:1"),
        files={"a.yml": "default_configs: [b.yml]\n", "b.yml": "default_configs: [bad.yml]\n"},
    ),
    "default-configs-not-a-list": Case(
        "default_configs: {file: a.yml}\n" + GOOD_PIPELINE,
        ("bad.yml:1", "default_configs", "must be a list of file paths", "a mapping"),
    ),
    # ---- sections ---------------------------------------------------------------------------
    "unknown-top-level-section": Case(
        INCLUDE_DEFAULTS + GOOD_PIPELINE.replace("pipeline:", "pipline:"),
        ("bad.yml:2", "'pipline'", "unknown top-level section", "did you mean 'pipeline'?"),
    ),
    "unknown-training-key": Case(
        GOOD_CONFIG + "training:\n  optimiser: {type: SGD}\n",
        ("bad.yml:9", "training.optimiser", "unknown key", "did you mean 'optimizer'?"),
    ),
    "unknown-dataloader-key": Case(
        GOOD_CONFIG + "training:\n  dataloader: {batchsize: 8}\n",
        ("bad.yml:9", "training.dataloader.batchsize", "did you mean 'batch_size'?"),
    ),
    "wrong-value-type": Case(
        GOOD_CONFIG + "training:\n  dataloader: {batch_size: many}\n",
        ("bad.yml:9", "training.dataloader.batch_size", "integer", "'many'"),
    ),
    "out-of-range-value": Case(
        GOOD_CONFIG + "training:\n  dataloader: {batch_size: 0}\n",
        ("bad.yml:9", "training.dataloader.batch_size", "greater than 0", "(got 0)"),
    ),
    "unknown-early-stopping-key": Case(
        GOOD_CONFIG + "training:\n  terminal_conditions:\n    early_stopping: {patiance: 5}\n",
        ("bad.yml:10", "early_stopping.patiance", "did you mean 'patience'?"),
    ),
    "sampler-fraction-and-indices": Case(
        GOOD_CONFIG + "training:\n  sampler: {type: subset, fraction: 0.5, indices: [1, 2]}\n",
        ("bad.yml:9", "training.sampler", "'indices' and 'fraction' are exclusive"),
    ),
    "unknown-precision": Case(
        GOOD_CONFIG + "training:\n  precision: fp8\n",
        ("bad.yml:9", "training.precision", "'fp8'", "'bf16'"),
    ),
    "empty-name": Case(GOOD_CONFIG + "name: ''\n", ("bad.yml:8", "key 'name'", "non-empty")),
    "pipeline-not-a-mapping": Case(
        INCLUDE_DEFAULTS + "pipeline: [LeNet5, NLLLoss]\n",
        ("bad.yml:2", "section 'pipeline'", "must be a mapping"),
    ),
    # ---- interpolation and mandatory values -------------------------------------------------
    "interpolation-to-missing-key": Case(
        GOOD_CONFIG + "training:\n  dataloader: {batch_size: '${training.dataloader.size}'}\n",
        ("bad.yml:9", "training.dataloader.batch_size", "'${training.dataloader.size}'"),
    ),
    "mandatory-value-missing": Case(
        GOOD_CONFIG + "training:\n  seed: ???\n",
        ("bad.yml:9", "training.seed", "mandatory value missing", "training.seed=VALUE"),
    ),
    # ---- component types --------------------------------------------------------------------
    "unknown-component-type": Case(
        _with("type: LeNet5", "type: LeNet"),
        ("bad.yml:4", "'image_classifier'", "'LeNet'", "did you mean 'LeNet5'?"),
    ),
    "os-system-refused": Case(
        GOOD_CONFIG + "  evil: {type: 'os:system'}\n",
        ("bad.yml:8", "'evil'", "'os:system'", "it is in the standard library"),
    ),
    "builtins-eval-refused": Case(
        GOOD_CONFIG + "  evil: {type: 'builtins:eval'}\n",
        ("bad.yml:8", "'evil'", "'builtins:eval'", "it is in the standard library"),
    ),
    "class-that-is-not-a-component": Case(
        GOOD_CONFIG + "  params: {type: 'torchloom.zoo.models.lenet5:LeNet5Params'}\n",
        ("bad.yml:8", "'params'", "LeNet5Params", "not a torchloom Component subclass"),
    ),
    "type-from-missing-package": Case(
        GOOD_CONFIG + "  plugin: {type: 'nosuchpackage.models:Net'}\n",
        ("bad.yml:8", "'plugin'", "cannot import module 'nosuchpackage.models'"),
    ),
    "type-not-a-string": Case(
        GOOD_CONFIG + "  numbered: {type: 5}\n",
        ("bad.yml:8", "'numbered'", "must be a non-empty string"),
    ),
    "missing-type": Case(
        GOOD_CONFIG + "  thing: {dropout: 0.1}\n",
        ("bad.yml:8", "component 'thing'", "has no 'type'"),
    ),
    "task-in-pipeline": Case(
        GOOD_CONFIG + "  digits: {type: MNIST}\n",
        ("bad.yml:8", "component 'digits' (MNIST)", "is a task"),
    ),
    "model-used-as-task": Case(
        "training:\n  task: {type: MNIST, data_folder: /nowhere}\n"
        "test:\n  task: {type: LeNet5}\n" + GOOD_PIPELINE,
        ("bad.yml:4", "'test.task' (LeNet5)", "is a model, not a task"),
    ),
    "component-name-with-dot": Case(
        GOOD_CONFIG + "  loss.extra: {type: NLLLoss}\n",
        ("bad.yml:8", "'loss.extra'", "no '.'"),
    ),
    # ---- component parameters and reserved keys ---------------------------------------------
    "misspelt-parameter": Case(
        _with(LENET, LENET + "\n    dropot: 0.1"),
        ("bad.yml:6", "'image_classifier' (LeNet5)", "'dropot'", "did you mean 'dropout'?"),
    ),
    "wrong-parameter-type": Case(
        _with(LENET, LENET + "\n    dropout: lots"),
        ("bad.yml:6", "'image_classifier' (LeNet5)", "'dropout'", "'lots'"),
    ),
    "parameter-out-of-range": Case(
        _with(LENET, LENET + "\n    dropout: 1.5"),
        ("bad.yml:6", "'image_classifier' (LeNet5)", "'dropout'", "less than 1", "1.5"),
    ),
    "task-parameter-misspelt-value": Case(
        GOOD_CONFIG + "training:\n  task: {split: trian}\n",
        ("bad.yml:9", "'training.task' (MNIST)", "'split'", "'trian'"),
    ),
    "freeze-not-a-boolean": Case(
        _with(NLL, "nllloss: {type: NLLLoss, freeze: maybe}"),
        ("bad.yml:6", "'nllloss'", "'freeze'", "'maybe'"),
    ),
    "unknown-key-in-load": Case(
        _with(LENET, LENET + "\n    load: {file: w.pt, prefix: encoder.}"),
        ("bad.yml:6", "'image_classifier'", "'prefix'", "did you mean 'prefix_map'?"),
    ),
    "weights-file-missing": Case(
        _with(LENET, LENET + "\n    load: {file: missing_weights.pt}"),
        ("bad.yml:6", "'image_classifier'", "missing_weights.pt", "does not exist"),
    ),
    "weights-file-not-weights": Case(
        _with(LENET, LENET + f"\n    load: {DIR}/garbage.pt"),
        ("bad.yml:6", "'image_classifier'", "garbage.pt", "cannot read weights file"),
        files={"garbage.pt": "this is not a checkpoint"},
    ),
    "reshape-element-counts-differ": Case(
        GOOD_CONFIG + "  flatten:\n    type: ReshapeTensor\n    input_dims: [-1, 1, 28, 28]\n"
        "    output_dims: [-1, 700]\n    streams: {outputs: flat}\n",
        ("bad.yml:8", "'flatten' (ReshapeTensor)", "784", "700"),
    ),
    "lenet5-image-too-small": Case(
        GOOD_CONFIG
        + TINY
        + TINY.replace("training", "validation")
        + TINY.replace("training", "test"),
        ("bad.yml:", "'image_classifier' (LeNet5)", "8x8", "at least 12x12"),
    ),
    # ---- streams and globals ----------------------------------------------------------------
    "stream-renamed-to-unproduced": Case(
        _with(NLL, "nllloss: {type: NLLLoss, streams: {predictions: predictoins}}"),
        ("bad.yml:6", "'nllloss'", "'predictoins'", "did you mean 'predictions'?"),
    ),
    "renamed-stream-the-component-lacks": Case(
        _with(NLL, "nllloss: {type: NLLLoss, streams: {prediction: scores}}"),
        ("bad.yml:6", "'nllloss'", "'prediction'", "did you mean 'predictions'?"),
    ),
    "global-renamed-to-unpublished": Case(
        _with(LENET, "globals: {prediction_size: num_clases}"),
        ("bad.yml:5", "'image_classifier'", "'num_clases'", "did you mean 'num_classes'?"),
    ),
    "renamed-global-the-component-lacks": Case(
        _with(NLL, "nllloss: {type: NLLLoss, globals: {num_classes: classes}}"),
        ("bad.yml:6", "'nllloss'", "renames global 'num_classes'"),
    ),
    "two-components-write-one-stream": Case(
        GOOD_CONFIG + "  second: {type: LeNet5, globals: {prediction_size: num_classes}}\n",
        (
            "bad.yml:8",
            "'second'",
            "'predictions'",
            "already produced by component 'image_classifier'",
        ),
    ),
    "stream-cycle": Case(
        GOOD_CONFIG + "  r1: {type: ReshapeTensor, input_dims: [-1, 16], output_dims: [-1, 16],"
        " streams: {inputs: p, outputs: q}}\n"
        + "  r2: {type: ReshapeTensor, input_dims: [-1, 16], output_dims: [-1, 16],"
        " streams: {inputs: q, outputs: p}}\n",
        ("bad.yml:2", "stream cycle", "r1 (reads 'p' from r2)", "r2 (reads 'q' from r1)"),
    ),
    "no-loss": Case(
        INCLUDE_DEFAULTS + GOOD_PIPELINE.replace("  " + NLL + "\n", ""),
        ("bad.yml:2", "no loss component"),
    ),
    "dtype-mismatch-task-to-loss": Case(
        _with(NLL, "nllloss: {type: NLLLoss, streams: {targets: labels}}"),
        ("bad.yml:6", "'nllloss' (NLLLoss)", "stream 'labels'", "int64", "str"),
    ),
    "rank-mismatch": Case(
        GOOD_CONFIG
        + "  flat: {type: ReshapeTensor, input_dims: [-1, 784], output_dims: [-1, 784]}\n",
        ("bad.yml:8", "'flat' (ReshapeTensor)", "expected rank 2", "received rank 4"),
    ),
    "pipeline-freeze-unknown-component": Case(
        GOOD_CONFIG + "  freeze: [image_clasifier]\n",
        ("bad.yml:8", "'image_clasifier'", "did you mean 'image_classifier'?"),
    ),
    # ---- the command line -------------------------------------------------------------------
    "disable-unknown-component": Case(
        GOOD_CONFIG,
        ("'acuracy'", "names no component", "did you mean 'accuracy'?"),
        args=("--disable", "acuracy"),
    ),
    "override-unknown-key": Case(
        GOOD_CONFIG,
        ("'training.optimizer.lrr=1'", "did you mean 'lr'?", "+training.optimizer.lrr=1"),
        args=("training.optimizer.lrr=1",),
    ),
    "override-malformed": Case(
        GOOD_CONFIG,
        ("override 'training.optimizer'", "expected KEY=VALUE"),
        args=("training.optimizer",),
    ),
    "override-add-existing-key": Case(
        GOOD_CONFIG,
        ("'+training.optimizer.lr=1'", "already exists", "'++training.optimizer.lr=1'"),
        args=("+training.optimizer.lr=1",),
    ),
    "override-delete-missing-key": Case(
        GOOD_CONFIG,
        ("'~pipeline.viewer'", "'pipeline' has no key 'viewer'"),
        args=("~pipeline.viewer",),
    ),
    "override-invalid-yaml-value": Case(
        GOOD_CONFIG,
        ("'training.optimizer.lr=[1,'", "invalid YAML value"),
        args=("training.optimizer.lr=[1,",),
    ),
    "override-value-out-of-range": Case(
        GOOD_CONFIG,
        ("command-line override 'training.dataloader.batch_size=-3'", "greater than 0"),
        args=("training.dataloader.batch_size=-3",),
    ),
    # A check across a mapping's keys fails at the mapping, set in a file: the override that
    # changed one of its keys is named with it.
    "override-fails-a-check-across-keys": Case(
        GOOD_CONFIG,
        (
            "default_mnist.yml:6 (changed by command-line override "
            "'+training.dataloader.reservoir.size=8')",
            "reservoir.size 8 is smaller than batch_size 64",
        ),
        args=("+training.dataloader.reservoir.size=8",),
    ),
    "override-into-a-number": Case(
        GOOD_CONFIG,
        ("'training.optimizer.lr' is a number, not a mapping",),
        args=("training.optimizer.lr.decay=1",),
    ),
    "override-of-default-configs": Case(
        GOOD_CONFIG, ("'default_configs' cannot be changed",), args=("default_configs=[a.yml]",)
    ),
}


def _run_case(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[Result, Path]:
    configs, work = tmp_path / "configs", tmp_path / "work"
    configs.mkdir()
    work.mkdir()
    for name, text in case.files.items():
        path = configs / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.replace(DIR, str(configs)), encoding="utf-8")
    if isinstance(case.config, bytes):
        (configs / case.name).write_bytes(case.config)
    elif case.config is not None:
        write_config(configs, case.config.replace(DIR, str(configs)), case.name)
    monkeypatch.chdir(work)
    result = run_loom(capsys, "check", str(configs / case.name), *case.args)
    return result, work


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_malformed_config_is_a_plain_user_error(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    result, work = _run_case(case, tmp_path, monkeypatch, capsys)
    assert_user_error(result, *case.culprits)
    assert result.out == "", "a rejected config prints no pipeline table"
    assert list(work.iterdir()) == [], "a rejected config writes nothing"


def test_three_config_mistakes_are_all_listed_in_one_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (
        INCLUDE_DEFAULTS
        + GOOD_PIPELINE
        + "trainig:\n  seed: 1\n"  # an unknown section
        + "training:\n  optimiser: {type: SGD}\n"  # an unknown training key
        + "  dataloader: {batch_size: 0}\n"  # a value out of range
    )
    case = Case(text, ())
    result, work = _run_case(case, tmp_path, monkeypatch, capsys)
    assert_user_error(
        result,
        "3 problems",
        "'trainig'",
        "did you mean 'training'?",
        "training.optimiser",
        "did you mean 'optimizer'?",
        "training.dataloader.batch_size",
        "greater than 0",
    )
    assert list(work.iterdir()) == []


def test_three_component_mistakes_are_all_listed_in_one_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _with(LENET, LENET + "\n    dropot: 0.1").replace("type: NLLLoss", "type: NLLLos")
    case = Case(text, (), args=("--disable", "acuracy"))
    result, _ = _run_case(case, tmp_path, monkeypatch, capsys)
    assert_user_error(
        result,
        "3 problems",
        "'dropot'",
        "did you mean 'dropout'?",
        "'NLLLos'",
        "did you mean 'NLLLoss'?",
        "'acuracy'",
        "did you mean 'accuracy'?",
    )


def test_debug_adds_the_traceback_of_a_user_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write_config(tmp_path, _with("type: LeNet5", "type: LeNet"))
    monkeypatch.chdir(tmp_path)
    plain = run_loom(capsys, "check", str(bad))
    debug = run_loom(capsys, "--debug", "check", str(bad))
    assert_user_error(plain, "did you mean 'LeNet5'?")
    assert debug.status == 2
    assert "Traceback (most recent call last)" in debug.err
    assert "ComponentError" in debug.err
    # The same plain message still ends the output, after the traceback.
    assert debug.err.rstrip().endswith(plain.err.strip())
    assert debug.out == ""


@pytest.mark.parametrize("argv", [[], ["--debug"]])
def test_no_command_names_what_is_missing(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """argparse said "the following arguments are required: COMMAND, arguments", the second
    an internal name."""
    result = run_loom(capsys, *argv)
    assert result.status == 2
    assert (
        "a COMMAND is required, one of: check, config," in result.err
        and "arguments" not in result.err
    )


def test_help_says_each_options_default(capsys: pytest.CaptureFixture[str]) -> None:
    """The guide gives `--expdir`'s and `--tensorboard`'s defaults; `--help` did not."""
    from torchloom.cli.main import command_parser

    text = command_parser("train").format_help()
    flat = " ".join(text.split())
    assert "parent folder of run folders (default: runs)" in flat
    assert "histograms (default: 1)" in flat and "(0..) (default: 0)" in flat
    assert "(default: None)" not in flat and "(default: False)" not in flat
    assert "(default: )" not in flat and "(default: [])" not in flat
    assert "labels shown per input (default: 1)" in command_parser("predict").format_help()
    export = " ".join(command_parser("export").format_help().split())
    assert "(default: True)" not in export  # --static-batch, a store_false


@pytest.mark.parametrize(
    "include", [INCLUDE_DEFAULTS, "default_configs: ['loom://mnist/default_mnist.yml']\n"]
)
def test_the_good_base_config_passes(
    include: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Guards the cases above: each fails for its own mistake, not for one in the base."""
    assert GOOD_CONFIG.startswith(INCLUDE_DEFAULTS)
    good = write_config(tmp_path, include + GOOD_PIPELINE, "good.yml")
    monkeypatch.chdir(tmp_path)
    result = run_loom(capsys, "check", str(good))
    assert result.status == 0, result.err
    assert "handshake: ok (training, validation, test)" in result.out
