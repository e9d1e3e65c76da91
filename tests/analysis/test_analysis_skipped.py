"""Analysis items find the pipeline's classification outputs by what reads them, not by name,
and an item that cannot run says so once: a line in run.log, an entry in
reports/skipped.json, a row at the top of report.html."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from test_analysis_worst_samples import train

import torchloom
from torchloom.analysis.build import check_analysis
from torchloom.analysis.html_report import write_report
from torchloom.analysis.layer_statistics import LayerStatistics
from torchloom.analysis.sample_export import SampleExport
from torchloom.analysis.schema import AnalysisConfig, AugmentationConfig, LayerStatisticsConfig
from torchloom.analysis.skipped import read_skipped
from torchloom.cli.main import main
from torchloom.core.pipeline_builder import build_pipeline
from torchloom.engine.assemble import assemble
from torchloom.errors import ConfigError

CONFIGS = Path(torchloom.__file__).parent / "configs"
# The model's output renamed, and its two readers following the rename.
LOGITS = [
    "+pipeline.image_classifier.streams.predictions=logits",
    "+pipeline.nllloss.streams.predictions=logits",
    "+pipeline.accuracy.streams.predictions=logits",
]
# A few cheap items over the minimal preset: confusion matrices, ROC, worst samples.
PER_SAMPLE_ITEMS = [
    "+analysis.preset=minimal",
    "+analysis.confusion_matrix=true",
    "+analysis.roc=true",
    "+analysis.worst_samples=true",
]


def skip_lines(run_dir: Path) -> list[str]:
    log = (run_dir / "run.log").read_text(encoding="utf-8")
    return [line for line in log.splitlines() if "analysis: " in line and " skipped: " in line]


def test_renamed_predictions_are_found_through_their_readers(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    state = train(tmp_path_factory, [], [*LOGITS, *PER_SAMPLE_ITEMS], analysis=True)
    reports = state.run_dir / "reports"
    # The output is named after its stream: logits-<split>-...
    for split in ("training", "validation", "test"):
        assert (reports / f"logits-{split}-cm.png").is_file()
    with open(reports / "logits-test-roc.csv", newline="") as handle:
        auc = {row["curve"]: float(row["auc"]) for row in csv.DictReader(handle)}
    assert 0.5 < auc["micro average"] <= 1.0
    with open(reports / "worst_samples" / "worst.csv", newline="") as handle:
        assert len(list(csv.DictReader(handle))) == 16
    assert read_skipped(state.run_dir) == {} and skip_lines(state.run_dir) == []


PER_SAMPLE = [
    "confusion_matrix",
    "classification_report",
    "roc",
    "prediction_errors",
    "worst_samples",
]


def regression(**analysis: Any) -> dict[str, Any]:
    """A toy regression: nothing reads class scores against class targets."""
    config: dict[str, Any] = {
        "training": {
            "task": {"type": "toy_components:ToyTask", "target_dtype": "float32"},
            "terminal_conditions": {"epoch_limit": 1},
        },
        "pipeline": {
            "model": {
                "type": "toy_components:ToyLinear",
                "globals": {"prediction_size": "num_classes"},
            },
            "loss": {"type": "toy_components:ToySquaredError"},
        },
    }
    return {**config, "analysis": analysis} if analysis else config


def test_a_pipeline_without_classification_output_says_what_it_skipped(
    tmp_path: Path,
) -> None:
    result = torchloom.train(regression(), expdir=tmp_path, tensorboard=0)
    lines = [line for line in skip_lines(result.run_dir) if "classification" in line]
    assert len(lines) == 1, lines  # one line for all of them
    assert f"analysis: {', '.join(PER_SAMPLE)} skipped: no classification output" in lines[0]
    assert "analysis.outputs" in lines[0]  # and what to set
    skipped = read_skipped(result.run_dir)
    assert set(PER_SAMPLE) <= skipped.keys()
    assert "random_samples" in skipped  # vectors: no image or text to show
    assert not list((result.run_dir / "reports").glob("*-cm.*"))

    page = write_report(result.run_dir).read_text(encoding="utf-8")
    assert '<h2 id="skipped">Skipped analysis</h2>' in page
    assert ", ".join(PER_SAMPLE) in page and "no classification output" in page


def test_a_run_shorter_than_the_layer_statistics_interval_measures_its_first_step(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    config = AnalysisConfig(layer_statistics=LayerStatisticsConfig(interval=1000))
    state = train(tmp_path_factory, [LayerStatistics(config)])  # 8 steps
    with open(state.run_dir / "reports" / "layer_statistics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert {row["episode"] for row in rows} == {"1"}
    layers = {row["layer"] for row in rows}
    assert {"image_classifier.features.0", "image_classifier.classifier.5"} <= layers, layers
    assert all(float(row["gradient_norm"]) > 0 for row in rows if row["gradient_norm"])


def test_a_task_without_random_transforms_gets_a_note_not_a_grid(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    config = AnalysisConfig(random_samples=False, augmentation=AugmentationConfig(count=4))
    state = train(tmp_path_factory, [SampleExport(config)])  # MNIST as it is: no transforms
    assert not (state.run_dir / "reports" / "samples" / "augmentation.png").exists()
    why = read_skipped(state.run_dir)["augmentation"]
    assert "no random transforms" in why and "16 draws of sample 0" in why
    assert len(skip_lines(state.run_dir)) == 1
    page = write_report(state.run_dir).read_text(encoding="utf-8")
    assert "no random transforms" in page


def test_outputs_that_name_only_what_samples_show_skip_the_per_sample_items() -> None:
    config = regression(outputs=[{"texts": "labels"}])

    def where(*keys: object) -> str:
        return "regression.yml"

    checked, skipped = check_analysis(config, build_pipeline(config, where), where)
    assert [o.texts for o in checked.outputs] == ["labels"]
    assert list(skipped.values()) == [PER_SAMPLE]
    assert next(iter(skipped)).startswith("no classification output")
    # Naming a stream that does not exist is still an error.
    config = regression(outputs=[{"texts": "label"}])
    with pytest.raises(
        ConfigError, match=r"texts stream 'label' is .* \(did you mean 'labels'\?\)"
    ):
        check_analysis(config, build_pipeline(config, where), where)


def assembled_analysis(config: Path | str, overrides: list[str]) -> tuple[AnalysisConfig, Any]:
    assembled = assemble(config, overrides)
    return check_analysis(assembled.config.data, assembled.pipeline, assembled.config.where)


def test_two_heads_are_two_outputs_and_an_entry_must_choose(tmp_path: Path) -> None:
    two_heads = CONFIGS / "mnist" / "2lenet5_2losses.yml"
    config, skipped = assembled_analysis(two_heads, [])
    assert [(o.name, o.predictions, o.targets, o.ids) for o in config.outputs] == [
        ("predictions_a", "predictions_a", "targets", "indices"),
        ("predictions_b", "predictions_b", "targets", "indices"),
    ]
    assert skipped == {}
    # An entry that names only its images cannot say which head it means.
    with pytest.raises(ConfigError, match="found: 'predictions_a', 'predictions_b'"):
        assembled_analysis(two_heads, ["+analysis.outputs=[{images: inputs}]"])
    config, _ = assembled_analysis(
        two_heads, ["+analysis.outputs=[{predictions: predictions_b, images: inputs}]"]
    )
    (output,) = config.outputs
    assert (output.name, output.targets, output.images) == ("predictions_b", "targets", "inputs")


def test_loom_check_rejects_an_output_stream_that_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "misnamed.yml"
    path.write_text(
        "default_configs: [loom://mnist/lenet5.yml]\n"
        "analysis:\n"
        "  outputs: [{predictions: predicted}]\n",
        encoding="utf-8",
    )
    assert main(["check", str(path)]) == 2
    error = capsys.readouterr().err
    assert "misnamed.yml:3" in error and "predictions stream 'predicted'" in error
    assert "did you mean 'predictions'" in error


def test_skipped_items_are_said_once_per_reason(tmp_path: Path) -> None:
    from torchloom.analysis.skipped import say_skipped
    from torchloom.engine.distributed import SINGLE
    from torchloom.engine.reporting import close_logger, make_logger

    log = make_logger(tmp_path, quiet=True)
    run: Any = type("Run", (), {"run_dir": tmp_path, "log": log, "distributed": SINGLE})()
    for _ in range(3):  # a hook meeting the same problem on every batch, a resumed run
        say_skipped(run, ["roc", "history"], "why")
    say_skipped(run, ["roc"], "another reason")
    close_logger(log)
    lines = skip_lines(tmp_path)
    assert [line.split("analysis: ")[1] for line in lines] == [
        "roc, history skipped: why",
        "roc skipped: another reason",
    ]
    saved = json.loads((tmp_path / "reports" / "skipped.json").read_text())
    assert saved == {"roc": "another reason", "history": "why"}


def test_an_output_of_more_classes_than_the_reports_take_is_skipped_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A language model's vocabulary as classes: its confusion counts would grow with the
    square of the classes, on the device, for each split. Past the cap (made 5 here) the
    output's reports are skipped and the reason said once; below it, counted as before."""
    import torch

    from torchloom.analysis import classification
    from torchloom.engine.distributed import SINGLE
    from torchloom.engine.reporting import close_logger, make_logger

    monkeypatch.setattr(classification, "MAX_CLASSES", 5)
    log = make_logger(tmp_path, quiet=True)
    pipeline = type("Pipeline", (), {"globals": {}})()
    fields = {"run_dir": tmp_path, "log": log, "distributed": SINGLE, "pipeline": pipeline}
    run: Any = type("Run", (), fields)()
    outputs = [
        {"name": "words", "predictions": "word_scores", "targets": "words"},
        {"name": "digits", "predictions": "digit_scores", "targets": "digits"},
    ]
    analysis = classification.ClassificationAnalysis(
        AnalysisConfig.model_validate({"preset": "minimal", "outputs": outputs, "roc": True})
    )
    batch = {
        "word_scores": torch.randn(4, 6),
        "words": torch.tensor([0, 1, 2, 5]),
        "digit_scores": torch.randn(4, 5),
        "digits": torch.tensor([0, 1, 2, 4]),
    }
    for _ in range(3):
        analysis.eval_batch(run, "validation", batch)
    close_logger(log)
    assert set(analysis.counts) == {("digits", "validation")}
    (line,) = skip_lines(tmp_path)
    assert "classification reports (output 'words') skipped" in line
    assert "'word_scores' scores 6 classes, more than 5" in line
