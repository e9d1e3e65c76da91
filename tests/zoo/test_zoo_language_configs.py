"""The shipped language pipelines (configs/language/): each passes `loom check` (on reduced
data, or on a small file in the real format for translation, whose data is not available
offline), and the two with accuracy targets train on reduced data to a stated level."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import torchloom
from torchloom.cli.main import main

CONFIGS = Path(__file__).resolve().parents[2] / "src" / "torchloom" / "configs" / "language"
TRANSLATION = CONFIGS / "translation_seq2seq_attention.yml"
LANGUAGE_MODEL = CONFIGS / "language_model_ngram.yml"
# Reading offline data (packaged BBC News and chatterbot-corpus): a small training subset
# keeps the vocabulary quick to build.
OFFLINE = {
    "bbc_news_bow_ffn": ["+training.task.subset=200"],
    "bbc_news_embeddings_gru": ["+training.task.subset=200"],
    "bbc_news_minilm_ffn": ["+training.task.subset=200"],
    "language_id_bow": ["+training.task.subset=500"],
    "language_model_ngram": ["+training.task.subset=2000"],
}
QUICK = ["+training.seed=0"]
# Pairs in the manythings.org format: English, a tab, French, a tab, the attribution.
PAIRS = [
    ("Go.", "Va !"),
    ("Go.", "Marche."),
    ("I am cold.", "J'ai froid."),
    ("He is here.", "Il est ici."),
    ("She is tired.", "Elle est fatiguée."),
] + [(f"I am {n} years old.", f"J'ai {n} ans.") for n in range(10, 45)]


def write_pairs(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    attribution = "CC-BY 2.0 (France) Attribution: tatoeba.org #2877272 (CM) & #1158250 (Wild_Cat)"
    (folder / "eng-fra.txt").write_text("".join(f"{e}\t{f}\t{attribution}\n" for e, f in PAIRS))
    return folder


def test_every_language_config_is_tested() -> None:
    shipped = {path.stem for path in CONFIGS.glob("*.yml") if not path.stem.startswith("default_")}
    assert shipped == {*OFFLINE, TRANSLATION.stem}


@pytest.mark.parametrize("name", sorted(OFFLINE))
def test_offline_config_checks(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(CONFIGS / f"{name}.yml"), *OFFLINE[name]]) == 0
    out = capsys.readouterr().out
    assert "handshake: ok (training, validation, test)" in out
    if name.startswith("bbc_news"):
        assert "classes=5]" in out
    elif name == "language_id_bow":
        assert "num_classes=14" in out


def test_translation_checks_with_a_pairs_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_pairs(tmp_path / "translation")
    assert main(["check", str(TRANSLATION), f"training.task.data_folder={folder}"]) == 0
    out = capsys.readouterr().out
    assert "handshake: ok (training, validation, test)" in out
    assert "bleu" in out and "AttentionDecoder" in out


def test_a_test_task_filtering_other_sentences_than_training_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A test task without the training task's max_length drew its split from more sentences:
    19 of 40 test sentences were training ones."""
    folder = write_pairs(tmp_path / "translation")
    given = f"training.task.data_folder={folder}"
    assert main(["check", str(TRANSLATION), given, "++test.task.max_length=3"]) == 2
    assert "max_length is 3 where the training task's is" in capsys.readouterr().err


def test_translation_without_the_file_says_where_to_get_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", str(TRANSLATION), f"training.task.data_folder={tmp_path}"]) == 2
    error = capsys.readouterr().err
    assert "eng-fra.txt" in error and "manythings.org/anki" in error


@pytest.mark.slow
def test_translation_config_trains_and_reports_bleu(tmp_path: Path) -> None:
    folder = write_pairs(tmp_path / "translation")
    overrides = [
        f"training.task.data_folder={folder}",
        "training.terminal_conditions.epoch_limit=1",
        "training.dataloader.batch_size=8",
        *QUICK,
    ]
    result = torchloom.train(TRANSLATION, overrides, expdir=str(tmp_path), analysis=False)
    assert result.status == "epoch_limit"
    for section in ("validation", "test"):
        values = result.statistics[section]
        assert math.isfinite(values["loss"]) and 0.0 <= values["bleu"] <= 1.0
    vocabulary = (result.run_dir / "artifacts" / "target_indexer" / "vocabulary.txt").read_text()
    assert "years" in vocabulary.split()  # English is the target (reverse: true)


@pytest.mark.slow
def test_language_model_config_trains_on_a_plain_text_corpus(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    # Twenty documents, each the same two sentences a different number of times (a corpus's
    # repeated documents are kept once, so that none is in two splits).
    sentences = "the cat sat on the mat . the dog sat on the log ."
    for i in range(20):
        (corpus / f"{i:02d}.txt").write_text(" ".join([sentences] * (i + 1)) + "\n")
    overrides = [
        f"training.task.data_folder={corpus}",
        "training.task.packaged=false",
        "training.terminal_conditions.epoch_limit=8",
        "training.dataloader.batch_size=32",
        "training.optimizer.lr=0.01",
        *QUICK,
    ]
    for section in ("validation", "test"):
        overrides += [f"{section}.task.data_folder={corpus}", f"{section}.task.packaged=false"]
    result = torchloom.train(LANGUAGE_MODEL, overrides, expdir=str(tmp_path), analysis=False)
    # The same two sentences over and over: the next word is nearly always determined.
    assert result.statistics["test"]["accuracy"] >= 0.9
    assert result.statistics["test"]["loss"] < result.statistics["training"]["loss"] + 1.0


@pytest.mark.slow
def test_bbc_news_bow_ffn_trains_on_reduced_data(tmp_path: Path) -> None:
    overrides = [
        "+training.task.subset=500",
        "+validation.task.subset=200",
        "+test.task.subset=300",
        "training.terminal_conditions.epoch_limit=4",
        *QUICK,
    ]
    result = torchloom.train(
        CONFIGS / "bbc_news_bow_ffn.yml", overrides, expdir=str(tmp_path), analysis=False
    )
    # Five topics: chance is 0.2; the full data reaches 0.97 (benchmarks/language_accuracy.py).
    assert result.statistics["test"]["accuracy"] >= 0.9


@pytest.mark.slow
def test_language_id_bow_trains_on_reduced_data(tmp_path: Path) -> None:
    overrides = [
        "+training.task.subset=2000",
        "+validation.task.subset=200",
        "+test.task.subset=600",
        "training.terminal_conditions.epoch_limit=3",
        *QUICK,
    ]
    result = torchloom.train(
        CONFIGS / "language_id_bow.yml", overrides, expdir=str(tmp_path), analysis=False
    )
    # 14 languages: chance is 0.07 (0.15 for the most frequent, English); the full data
    # reaches 0.97 (benchmarks/language_accuracy.py).
    assert result.statistics["test"]["accuracy"] >= 0.85
