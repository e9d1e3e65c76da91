"""Code-first training: a plain nn.Module with Lazy layers, plain datasets, same engine, and
the same `analysis:` reports as a YAML run."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn
from torch.utils.data import TensorDataset

import torchloom
from torchloom import outputs
from torchloom.errors import ConfigError


def clusters(n: int, seed: int) -> TensorDataset:
    """Three well-separated Gaussian clusters in 8 dimensions."""
    generator = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, 3, (n,), generator=generator)
    centres = torch.eye(3, 8) * 4
    inputs = centres[targets] + torch.randn(n, 8, generator=generator)
    return TensorDataset(inputs, targets)


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.LazyLinear(16), nn.ReLU(), nn.LazyLinear(3))

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, outputs.Output]:
        logits = self.body(batch["inputs"])
        return {
            "cluster": outputs.Classification(logits, target="targets"),
            "features": outputs.Embedding(logits),
        }


def test_fit_trains_a_lazy_module_into_a_run_folder_with_a_yaml_runs_reports(
    tmp_path: Path,
) -> None:
    trainer = torchloom.Trainer(
        epochs=3,
        batch_size=32,
        seed=1,
        expdir=tmp_path,
        optimizer={"type": "Adam", "lr": 0.01},
        name="clusters",
    )
    result = trainer.fit(Classifier(), train=clusters(256, 0), validation=clusters(64, 1))
    assert result.status == "epoch_limit" and result.summary["epochs"] == 3
    assert result.run_dir.parent == tmp_path / "clusters"
    assert result.statistics["validation"]["accuracy"] > 0.9
    for name in (
        "config.yaml",
        "summary.json",
        "checkpoints/last.pt",
        "checkpoints/best.pt",
        "training_epoch_statistics.csv",
        "validation_epoch_statistics.csv",
    ):
        assert (result.run_dir / name).is_file(), name
    config = yaml.safe_load((result.run_dir / "config.yaml").read_text())
    assert config["pipeline"] == "built in Python from Classifier"
    # No `analysis=`: the default preset, as for a YAML run without an analysis section, with
    # the module's Classification output analysed by the sample ids its task adds.
    assert config["analysis"] == {
        "outputs": [
            {"name": "cluster", "predictions": "cluster", "targets": "targets", "ids": "indices"}
        ]
    }
    reports = result.run_dir / "reports"
    for name in (
        "model_summary.md",
        "learning_rate.csv",
        "history/accuracy.png",
        "cluster-training-report.md",
        "cluster-validation-cm.csv",
        "cluster-validation-roc.png",
        "cluster-validation-errors.csv",
        "worst_samples/worst.csv",
    ):
        assert (reports / name).is_file(), name
    report = (reports / "cluster-validation-report.md").read_text()
    accuracy = result.statistics["validation"]["accuracy"]
    assert f"64 samples, accuracy {accuracy:.4f}" in report
    assert (
        "| model | module.body.0 | Linear | [32, 16] | 144 |"
        in (reports / "model_summary.md").read_text()
    )
    with open(reports / "worst_samples" / "worst.csv", newline="") as handle:
        ids = [int(row["id"]) for row in csv.DictReader(handle)]
    assert ids and all(0 <= i < 256 for i in ids)  # training sample positions


@pytest.mark.parametrize(
    ("analysis", "expected"),
    [
        ("minimal", {"history", "learning_rate.csv", "learning_rate.png"}),
        (
            {"preset": "minimal", "learning_rate": False, "model_summary": True},
            {"history", "model_summary.md"},
        ),
        (False, None),
    ],
)
def test_analysis_takes_a_preset_name_a_mapping_or_false(
    tmp_path: Path, analysis: Any, expected: set[str] | None
) -> None:
    result = torchloom.Trainer(
        epochs=1, batch_size=32, seed=3, expdir=tmp_path, analysis=analysis
    ).fit(Classifier(), train=clusters(64, 0))
    reports = result.run_dir / "reports"
    assert (set(p.name for p in reports.iterdir()) if reports.exists() else None) == expected


@pytest.mark.parametrize(
    ("analysis", "message"),
    [
        ("fulll", "key 'analysis.preset': Input should be 'minimal', 'default' or 'full'"),
        ({"rocc": False}, "key 'analysis.rocc': unknown key (did you mean 'roc'?)"),
        (
            {"outputs": [{"name": "digits", "predictions": "digit"}]},
            "predictions stream 'digit' is produced by no component or task",
        ),
        (3, "must be a preset name, a mapping or False, got int"),
    ],
)
def test_a_bad_analysis_is_an_error_naming_the_trainer_before_anything_is_written(
    tmp_path: Path, analysis: Any, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        torchloom.Trainer(epochs=1, expdir=tmp_path, analysis=analysis).fit(
            Classifier(), clusters(8, 0)
        )
    assert caught.value.problems[0].where == "Trainer(analysis=...)"
    assert message in str(caught.value)
    assert not any(tmp_path.iterdir())


def test_fit_resumes_and_extends_a_run(tmp_path: Path) -> None:
    first = torchloom.Trainer(epochs=1, batch_size=32, seed=2, expdir=tmp_path).fit(
        Classifier(), train=clusters(128, 0)
    )
    longer = torchloom.Trainer(epochs=2, batch_size=32, seed=2, expdir=tmp_path).fit(
        Classifier(), train=clusters(128, 0), resume=first.run_dir
    )
    assert longer.run_dir == first.run_dir and longer.summary["epochs"] == 2
    summary = json.loads((first.run_dir / "summary.json").read_text())
    assert summary["episodes"] == 8
    # The analysis hooks resumed with the run: their reports are of the second epoch.
    report = (first.run_dir / "reports" / "cluster-training-report.md").read_text()
    assert report.startswith("# cluster, training (epoch 2, episode 8)")


def test_regression_output_and_dict_samples(tmp_path: Path) -> None:
    class DictData(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
        def __init__(self) -> None:
            self.x = torch.linspace(-1, 1, 64).unsqueeze(1)

        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"x": self.x[i], "y": 3 * self.x[i]}

    class Line(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(1, 1)

        def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, outputs.Output]:
            return {"fit": outputs.Regression(self.linear(batch["x"]), target="y", loss="l1")}

    result = torchloom.Trainer(
        epochs=30,
        batch_size=16,
        seed=0,
        expdir=tmp_path,
        optimizer={"type": "SGD", "lr": 0.1},
        analysis=False,
    ).fit(Line(), DictData())
    assert result.statistics["training"]["loss"] < 0.1


def test_a_module_that_returns_plain_tensors_is_a_clear_error(tmp_path: Path) -> None:
    class Plain(nn.Module):
        def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
            return batch["inputs"]

    with pytest.raises(ConfigError, match="must return"):
        torchloom.Trainer(epochs=1, expdir=tmp_path).fit(Plain(), clusters(8, 0))
    assert not any(tmp_path.iterdir())


def test_unknown_trainer_setting_is_an_error_when_the_trainer_is_made(tmp_path: Path) -> None:
    """It was one only at fit(), after the data had been opened and the pipeline built."""
    with pytest.raises(ConfigError, match="optimiser"):
        torchloom.Trainer(epochs=1, expdir=tmp_path, optimiser={"lr": 1})


def test_trainer_settings_are_checked_key_by_key(tmp_path: Path) -> None:
    """Each wrong keyword of Trainer(...) is its own problem naming the key, with the closest
    known key and what was received (it was one problem holding pydantic's whole text)."""
    with pytest.raises(ConfigError) as caught:
        torchloom.Trainer(
            epochs=1, expdir=tmp_path, optimiser={"lr": 1}, gradient_clipping={"norm": "big"}
        )
    problems = {p.subject: p for p in caught.value.problems}
    assert set(problems) == {"key 'optimiser'", "key 'gradient_clipping.norm'"}
    assert problems["key 'optimiser'"].suggestion == "did you mean 'optimizer'?"
    assert "(got 'big')" in problems["key 'gradient_clipping.norm'"].message
    assert all(p.where == "Trainer(...)" for p in caught.value.problems)
    assert not any(tmp_path.iterdir())


def test_a_module_already_on_the_run_s_device_builds_its_pipeline() -> None:
    """`fit` moves the user's module to the run's device in place, so the same object given
    again (`process(run, module=net)`, a second `fit`, a resume) is on the GPU: the dry run
    that names its outputs runs where the module is (the meta device stands in for a GPU,
    where host inputs would be a device error)."""
    from torchloom.engine.code_first_pipeline import build_pipeline

    module = Classifier()
    build_pipeline(module, {"training": clusters(8, 0)})  # as fit's first build does
    module.to("meta")
    pipeline = build_pipeline(module, {"training": clusters(8, 0)})
    assert set(pipeline.components["model"].output_specs()) == {"cluster", "features"}


def test_a_dataset_on_a_device_is_refused_naming_its_section() -> None:
    """Samples on a device could not be pinned for the copy to the GPU, nor sent to loader
    workers: the dataset is refused with what to change."""
    from torchloom.engine.code_first_pipeline import build_pipeline

    on_device = TensorDataset(torch.zeros(4, 8, device="meta"), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ConfigError, match="sample 0's 'inputs'") as error:
        build_pipeline(Classifier(), {"validation": on_device})
    assert "is on meta" in str(error.value) and "validation" in str(error.value)
    assert "CPU tensors" in str(error.value)


def test_accuracy_leaves_out_the_targets_a_classification_output_ignores(tmp_path: Path) -> None:
    """The accuracy statistic was built with its own default ignore_index (-100), so targets
    the loss ignored (here -1, half of them) counted as wrong in summary.json while the
    analysis report left them out: the two disagreed."""

    class Ignoring(Classifier):
        def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, outputs.Output]:
            logits = self.body(batch["inputs"])
            return {"cluster": outputs.Classification(logits, ignore_index=-1)}

    data = clusters(128, 0)
    targets = data.tensors[1].clone()
    targets[::2] = -1
    ignored = TensorDataset(data.tensors[0], targets)
    result = torchloom.Trainer(
        epochs=3, batch_size=32, seed=1, expdir=tmp_path, optimizer={"type": "Adam", "lr": 0.01}
    ).fit(Ignoring(), train=ignored, validation=ignored)
    accuracy = result.statistics["validation"]["accuracy"]
    assert accuracy > 0.9  # counted over the 64 kept targets, not the 128
    report = (result.run_dir / "reports" / "cluster-validation-report.md").read_text()
    assert f"accuracy {accuracy:.4f}" in report


def test_a_regression_against_targets_of_another_shape_is_refused(tmp_path: Path) -> None:
    """[batch, 1] predictions against [batch] targets broadcast the loss to [batch, batch]
    (torch only warned): a wrong loss, trained on. It is refused before anything is written."""

    class Scalar(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 1)

        def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, outputs.Output]:
            return {"y": outputs.Regression(self.linear(batch["inputs"]))}

    inputs = torch.randn(16, 4)
    with pytest.raises(ConfigError) as caught:
        torchloom.Trainer(epochs=1, expdir=tmp_path, analysis=False).fit(
            Scalar(), train=TensorDataset(inputs, inputs.sum(1))
        )
    message = str(caught.value)
    assert "Regression output 'y'" in message and "[batch, 1]" in message
    assert "'targets' is [batch]" in message and "Traceback" not in message
    assert not any(tmp_path.iterdir())
