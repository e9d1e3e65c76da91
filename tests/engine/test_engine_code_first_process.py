"""`loom process` of a code-first run: `fit` records the module's class and arguments and the
datasets' factories, the processor builds them again; what cannot be rebuilt is named, and the
Python API takes the objects in code instead."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn

import code_first_models as models
import torchloom
from torchloom import outputs
from torchloom.cli.main import main
from torchloom.errors import ConfigError


def loom(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def fit(expdir: Path, module: nn.Module, test: Any, seed: int = 5) -> torchloom.RunResult:
    trainer = torchloom.Trainer(
        epochs=2,
        batch_size=32,
        seed=seed,
        expdir=expdir,
        optimizer={"type": "Adam", "lr": 0.01},
        analysis=False,
    )
    # The three ways to give data: a factory, its import path, an object.
    return trainer.fit(
        module, train=models.train_set, validation="code_first_models:validation_set", test=test
    )


def processed(folder: Path, section: str = "test") -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((folder / f"{section}_summary.json").read_text())
    return summary


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> torchloom.RunResult:
    """One rebuildable run: an importable module whose width is in its hparams, and data
    from importable factories."""
    return fit(tmp_path_factory.mktemp("runs"), models.Clusters(width=24), models.test_set)


def test_fit_records_how_to_build_the_module_and_data_again(run: torchloom.RunResult) -> None:
    config = yaml.safe_load((run.run_dir / "config.yaml").read_text())
    assert config["code_first"] == {
        "module": {"class": "code_first_models:Clusters", "init_args": {"width": 24, "classes": 3}},
        "data": {
            "training": {"factory": "code_first_models:train_set"},
            "validation": {"factory": "code_first_models:validation_set"},
            "test": {"factory": "code_first_models:test_set"},
        },
    }


def test_loom_process_rebuilds_a_code_first_run_and_matches_its_test_pass(
    run: torchloom.RunResult, capsys: pytest.CaptureFixture[str]
) -> None:
    status, output = loom(capsys, "process", str(run.run_dir))
    assert status == 0, output
    folder = Path(output.split("written to: ")[1].strip())
    assert folder.parent == run.run_dir / "process"
    summary = processed(folder)
    final = run.statistics["test"]
    assert summary["checkpoint"] == str(run.run_dir / "checkpoints" / "best.pt")
    assert summary["samples"] == final["samples"] == 96
    assert summary["statistics"]["accuracy"] == final["accuracy"]
    assert summary["statistics"]["loss"] == pytest.approx(final["loss"], rel=1e-5)
    assert f"test: loss {final['loss']:.4f}, accuracy {final['accuracy']:.4f}" in output
    # The width came from the record: the default (16) would not load the weights.
    assert final["accuracy"] > 0.9


def test_an_override_of_the_record_names_other_data(
    run: torchloom.RunResult, capsys: pytest.CaptureFixture[str]
) -> None:
    override = "code_first.data.test.factory=code_first_models:validation_set"
    status, output = loom(capsys, "process", str(run.run_dir), override)
    assert status == 0, output
    assert "samples 64" in output  # the validation set, 64 samples


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "code_first.module.class=os:getcwd",
            "module class 'os:getcwd': it is in the standard library",
        ),
        (
            "code_first.module.class=code_first_models:clusters",
            "module class 'code_first_models:clusters': is not an nn.Module subclass",
        ),
        (
            "code_first.data.test.factory=code_first_models:Clusters",
            "test data factory 'code_first_models:Clusters': it is a class; a dataset factory "
            "is a Python function or a Dataset class",
        ),
        (  # a run folder of a torchloom that recorded nothing
            "~code_first",
            "module: cannot be rebuilt: the run records no way to build it",
        ),
        (
            "+code_first.module.init_args.depth=3",
            "module code_first_models:Clusters: got an unexpected keyword argument 'depth'",
        ),
        (  # a bare traceback (exit 1) at the dry run: the record is input
            "code_first.module.init_args.width=-5",
            "module Clusters: fails on the test data (the module or the data the run "
            "records): RuntimeError: Trying to create tensor with negative dimension -5",
        ),
    ],
)
def test_a_record_naming_what_fit_could_not_have_recorded_is_refused_before_a_call(
    run: torchloom.RunResult, capsys: pytest.CaptureFixture[str], override: str, message: str
) -> None:
    status, output = loom(capsys, "process", str(run.run_dir), override)
    assert status == 2, output
    assert message in output and "Traceback" not in output


def test_a_record_whose_module_would_not_fit_in_memory_is_refused_before_it_is_built(
    run: torchloom.RunResult, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record is input: Linear(15000, 15000) took 1.4 GB before its traceback, and
    10^6 x 10^6 ended in the allocator's traceback."""
    linear = ["code_first.module.class=torch.nn:Linear", "~code_first.module.init_args"]
    huge = "+code_first.module.init_args={in_features: 1000000, out_features: 1000000}"
    status, output = loom(capsys, "process", str(run.run_dir), *linear, huge)
    assert status == 2, output
    assert "module torch.nn:Linear: its weights would take about 3725" in output
    assert "Traceback" not in output
    negative = "+code_first.module.init_args={in_features: -1, out_features: 2}"
    status, output = loom(capsys, "process", str(run.run_dir), *linear, negative)
    assert status == 2 and "cannot be built with its recorded arguments" in output, output


def test_what_cannot_be_rebuilt_is_named_and_the_python_api_takes_it_in_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    class Local(nn.Module):  # defined in a function: no import path
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.LazyLinear(3)

        def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, outputs.Output]:
            return {"cluster": outputs.Classification(self.body(batch["inputs"]))}

    test_set = models.clusters(48, 7)
    result = fit(tmp_path, Local(), test_set)
    status, output = loom(capsys, "process", str(result.run_dir))
    assert status == 2
    assert "module Local: cannot be rebuilt: " in output
    assert "Local is defined inside a function" in output
    assert "torchloom.process(run_dir, module=...)" in output
    assert not (result.run_dir / "process").exists()

    # The module in code; the test data is still an object the run could not record.
    with pytest.raises(ConfigError) as caught:
        torchloom.process(result.run_dir, module=Local())
    assert "test data: cannot be rebuilt: a TensorDataset object was given" in str(caught.value)
    assert "torchloom.process(run_dir, section='test', data=...)" in str(caught.value)

    # Both in code: any code-first run can be processed.
    evaluation = torchloom.process(result.run_dir, module=Local(), data=test_set)
    assert evaluation.statistics["samples"] == 48
    assert evaluation.statistics["accuracy"] == result.statistics["test"]["accuracy"]
    # ... and on a section the run never had.
    other = torchloom.process(
        result.run_dir, section="holdout", module=Local(), data="code_first_models:test_set"
    )
    assert other.statistics["samples"] == 96


def test_a_module_whose_arguments_are_unknown_says_to_record_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = fit(tmp_path, models.Unrecorded(width=8), models.test_set, seed=6)
    status, output = loom(capsys, "process", str(result.run_dir))
    assert status == 2
    assert (
        "module code_first_models:Unrecorded: cannot be rebuilt: its constructor takes (width) "
        "and it has no `hparams` mapping of their values; set self.hparams = {'width': width} "
        "in __init__"
    ) in output
    evaluation = torchloom.process(result.run_dir, module=models.Unrecorded(width=8))
    assert evaluation.statistics["accuracy"] == result.statistics["test"]["accuracy"]


def test_objects_in_code_are_refused_for_a_yaml_pipeline(tmp_path: Path) -> None:
    config = tmp_path / "toy.yml"
    config.write_text(
        "training:\n  task: {type: 'toy_components:ToyTask'}\n"
        "test:\n  task: {type: 'toy_components:ToyTask'}\n"
        "pipeline:\n  model: {type: 'toy_components:ToyLinear', "
        "globals: {prediction_size: num_classes}}\n"
        "  loss: {type: 'toy_components:ToyLoss'}\n"
    )
    with pytest.raises(ConfigError, match=r"module= and data= are for runs of torchloom\.Trainer"):
        torchloom.process(config, module=models.Clusters())


def test_factories_drawing_from_the_global_generator_build_the_same_data_again(
    tmp_path: Path,
) -> None:
    """fit seeded once and called the train, validation and test factories in turn, while
    process seeded and called one: a factory drawing from the global generator returned other
    samples, and process measured other data. Each factory is now called seeded by the run's
    seed and its section."""
    trainer = torchloom.Trainer(epochs=1, batch_size=32, seed=4, expdir=tmp_path, analysis=False)
    result = trainer.fit(
        models.Clusters(),
        train=models.drawn_train_set,
        validation=models.drawn_validation_set,
        test=models.drawn_test_set,
    )
    for section in ("validation", "test"):
        again = torchloom.process(result.run_dir, section=section, checkpoint="last")
        final = result.statistics[section]
        assert again.statistics["loss"] == pytest.approx(final["loss"], rel=1e-5), section


def test_hparams_missing_a_defaulted_argument_is_not_rebuildable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only the recorded arguments were checked to bind, so hparams without a defaulted
    argument rebuilt the module with the default: another model, silently (here it does not
    even fit the weights). The record now says which arguments are missing."""
    result = fit(tmp_path, models.PartlyRecorded(width=8, classes=4), models.test_set, seed=7)
    config = yaml.safe_load((result.run_dir / "config.yaml").read_text())
    assert "init_args" not in config["code_first"]["module"]
    status, output = loom(capsys, "process", str(result.run_dir))
    assert status == 2 and "Traceback" not in output
    assert (
        "module code_first_models:PartlyRecorded: cannot be rebuilt: its hparams lack the "
        "constructor's argument(s) classes"
    ) in output


def test_a_code_first_run_given_to_yaml_commands_says_to_use_fit(
    run: torchloom.RunResult, capsys: pytest.CaptureFixture[str]
) -> None:
    """`loom train --resume`, `loom check` and `torchloom.train(resume=)` said "unknown
    top-level section 'code_first'" of a Trainer.fit run folder."""
    expected = "a run of torchloom.Trainer(...).fit(...)"
    for argv in (
        ("train", "--resume", str(run.run_dir)),
        ("check", str(run.run_dir / "config.yaml")),
    ):
        status, output = loom(capsys, *argv)
        assert status == 2, output
        assert expected in output and "fit(..., resume=" in output, output
        assert "unknown top-level section" not in output and "Traceback" not in output
    with pytest.raises(ConfigError, match=r"fit\(\.\.\., resume="):
        torchloom.train(resume=run.run_dir)
