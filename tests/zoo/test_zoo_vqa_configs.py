"""The shipped CLEVR and VQA-Med pipelines (configs/vqa/): they build their vocabulary and
answer set from the training data, so they are checked, and trained for one short epoch, on
small data sets written in the real formats (tests/vqa_fixtures.py) and a tiny GloVe file,
with tiny images; without the data, `loom check` names what is missing and where to get it."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

import torchloom
from torchloom.cli.main import main
from torchloom.zoo.tasks.vqa_med import VQAMed2019
from vqa_fixtures import MED_QUESTIONS, write_clevr, write_glove, write_vqa_med

CONFIGS = Path(__file__).resolve().parents[2] / "src" / "torchloom" / "configs" / "vqa"
CLEVR_CONFIG = CONFIGS / "clevr_convnet_lstm_concat.yml"
MED_CONFIGS = ["vqa_med_vgg_glove_attention", "vqa_med_mcb", "vqa_med_mfb"]
# Small and quick: no worker processes, batches of 4, one epoch.
QUICK = [
    "training.dataloader.batch_size=4",
    "training.dataloader.num_workers=0",
    "validation.dataloader.num_workers=0",
    "training.terminal_conditions.epoch_limit=1",
    "+training.seed=0",
]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vqa_data")
    write_clevr(root / "CLEVR_v1.0", {"train": 4, "val": 2})
    write_vqa_med(root / "vqa-med-2019", {"train": 3, "validation": 2, "test": 2})
    # 300 dimensions, as the configs' glove.6B.300d.txt; some question words are left out.
    words = sorted({w for question, _ in MED_QUESTIONS.values() for w in question[:-1].split()})
    write_glove(root / "glove.txt", [w for w in words if w != "abnormal"], 300)
    return root


def clevr_overrides(data: Path) -> list[str]:
    return [f"training.task.data_folder={data / 'CLEVR_v1.0'}"]


def med_overrides(data: Path) -> list[str]:
    return [
        f"training.task.data_folder={data / 'vqa-med-2019'}",
        f"pipeline.embeddings.pretrained_file={data / 'glove.txt'}",
        # No ImageNet weights offline: the randomly initialised network of the same shape.
        "pipeline.image_encoder.pretrained=none",
    ]


def test_clevr_config_checks_with_the_data(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(CLEVR_CONFIG), *clevr_overrides(data)]) == 0
    out = capsys.readouterr().out
    assert "handshake: ok (training, validation)" in out
    assert "predictions [batch, classes=28]" in out


@pytest.mark.parametrize("name", MED_CONFIGS)
def test_vqa_med_configs_check_with_the_data(
    name: str, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", str(CONFIGS / f"{name}.yml"), *med_overrides(data)]) == 0
    out = capsys.readouterr().out
    assert "handshake: ok (training, validation, test)" in out
    # The answer set is the 12 answers of the 3 training images (4 categories x 3).
    assert "predictions [batch, classes=12]" in out
    # How many question words the GloVe file has: all but "abnormal", left out of it.
    found = re.search(rf"note: embeddings: (\d+) of (\d+) words .* in {data / 'glove.txt'}", out)
    assert found is not None and int(found[1]) == int(found[2]) - 1


def test_without_the_data_check_names_the_layout_and_the_download(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", str(CLEVR_CONFIG), f"training.task.data_folder={tmp_path}"]) == 2
    error = capsys.readouterr().err
    assert "CLEVR_train_questions.json" in error and "CLEVR_v1.0.zip" in error
    config = CONFIGS / "vqa_med_mfb.yml"
    assert main(["check", str(config), f"training.task.data_folder={tmp_path}"]) == 2
    error = capsys.readouterr().err
    assert "ImageClef-2019-VQA-Med-Training" in error
    assert "https://github.com/abachaa/VQA-Med-2019" in error


@pytest.mark.slow
def test_clevr_config_trains(data: Path, tmp_path: Path) -> None:
    tiny = [
        "training.task.resize=[32,32]",
        # 32x32 images leave 24 maps of 2x2 after the four poolings.
        "pipeline.flatten.input_dims=[-1,24,2,2]",
        "pipeline.flatten.output_dims=[-1,96]",
    ]
    result = torchloom.train(
        CLEVR_CONFIG, [*clevr_overrides(data), *tiny, *QUICK], expdir=str(tmp_path)
    )
    assert result.status == "epoch_limit"
    assert result.statistics["training"]["episode"] == 3  # 12 questions in batches of 4
    assert math.isfinite(result.statistics["validation"]["loss"])
    assert result.statistics["validation"]["samples"] == 6
    vocabulary = (result.run_dir / "artifacts" / "indexer" / "vocabulary.txt").read_text()
    assert "square" in vocabulary.split()
    # The analysis names the answers (the task's label_word_mappings).
    report = (result.run_dir / "reports" / "predictions-validation-report.md").read_text()
    assert "| yes |" in report and "| red |" in report


@pytest.mark.slow
@pytest.mark.parametrize("name", MED_CONFIGS)
def test_vqa_med_config_trains(name: str, data: Path, tmp_path: Path) -> None:
    overrides = [
        *med_overrides(data),
        "training.task.resize=[32,32]",  # the smallest vgg16 takes
        "test.dataloader.num_workers=0",
        *QUICK,
    ]
    # The analysis costs seconds: run it with one of the three (they share its settings).
    analysis = name == "vqa_med_mfb"
    result = torchloom.train(
        CONFIGS / f"{name}.yml", overrides, expdir=str(tmp_path), analysis=analysis
    )
    assert result.status == "epoch_limit"
    assert result.statistics["training"]["episode"] == 3
    for section in ("validation", "test"):
        values = result.statistics[section]
        assert values["samples"] == 8 and math.isfinite(values["loss"])
        assert 0.0 <= values["accuracy"] <= 1.0
    # The classifier's answers (the LabelIndexer's) are the ones the task's targets index.
    labels = (result.run_dir / "artifacts" / "answer_indexer" / "labels.txt").read_text()
    assert re.search(r"INFO embeddings: \d+ of \d+ words", (result.run_dir / "run.log").read_text())
    task = VQAMed2019.create(data_folder=str(data / "vqa-med-2019"))
    assert labels.splitlines() == task.answer_vocabulary()
    if analysis:
        # Half of the test answers are not among the training answers: left out (4 of 8).
        report = (result.run_dir / "reports" / "predictions-test-report.md").read_text()
        assert "4 samples" in report
        # Answers are named (the LabelIndexer's mappings); no confusion matrix over them.
        errors = (result.run_dir / "reports" / "predictions-test-errors.csv").read_text()
        assert set(errors.splitlines()[0].split(",")) >= {"truth_name", "prediction_name"}
        assert any(answer in errors for answer in labels.splitlines())
        assert not list((result.run_dir / "reports").glob("*-cm.*"))
