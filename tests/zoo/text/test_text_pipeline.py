"""A text pipeline end to end: tokenizer -> indexer -> bag of words -> classifier, trained on
a toy task defined here; the vocabulary lands in the run folder, validation uses the training
vocabulary, and a later `process` config reads that file back against the checkpoint."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from pydantic import Field

import torchloom
from torchloom.cli.main import main
from torchloom.core.component import Batch, BuildContext, ComponentParams, Task
from torchloom.core.streams import StreamSpec
from torchloom.errors import ComponentError
from torchloom.zoo.text.vocabulary import Vocabulary

PETS = ["the cat sleeps", "a dog barks loudly", "my cat purrs", "the puppy plays", "dog and cat"]
MARKETS = ["stocks fell sharply", "the market rallied", "bond yields rose", "shares and stocks"]
# Validation-only words: a vocabulary built from the validation texts would hold them.
VALIDATION = [("the zebra cat sleeps", 0), ("quasar stocks rallied", 1), ("dog plays", 0)]


class ToyTexts(Task):
    """Two topics, pets (0) and markets (1); validation has words training never shows."""

    class Params(ComponentParams):
        split: Literal["train", "validation"] = Field("train")

    PUBLISHES_GLOBALS = {"num_classes": "number of topics"}

    def __init__(self, params: Any, context: BuildContext) -> None:
        super().__init__(params, context)
        if params.split == "train":
            self.samples = [(t, 0) for t in PETS] + [(t, 1) for t in MARKETS]
            self.samples *= 3
        else:
            self.samples = list(VALIDATION)
        self.publish_global("num_classes", 2)

    def dimension_sizes(self) -> dict[str, int]:
        return {"classes": 2}

    def output_specs(self) -> dict[str, StreamSpec]:
        return {
            "indices": StreamSpec(("batch",), torch.int64, "sample index"),
            "inputs": StreamSpec(("batch",), str, "text"),
            "targets": StreamSpec(("batch",), torch.int64, "topic"),
        }

    def texts(self, stream: str) -> Iterator[Any]:
        if stream != "inputs":  # only the texts are cheap; anything else the usual way
            yield from super().texts(stream)
            return
        yield from (text for text, _ in self.samples)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Batch:
        text, topic = self.samples[index]
        return {"indices": index, "inputs": text, "targets": topic}


TASK = "test_text_pipeline:ToyTexts"


def pipeline(indexer: dict[str, Any]) -> dict[str, Any]:
    return {
        "tokenizer": {"type": "SentenceTokenizer"},
        "indexer": {"type": "SentenceIndexer", **indexer},
        "bow": {"type": "BOWEncoder", "mode": "binary"},
        "classifier": {
            "type": "FeedForwardNetwork",
            "streams": {"inputs": "bow"},
            "globals": {"input_size": "vocabulary_size", "prediction_size": "num_classes"},
        },
        "nllloss": {"type": "NLLLoss"},
        "accuracy": {"type": "AccuracyStatistics"},
    }


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = {
        "name": "toy_texts",
        "training": {
            "task": {"type": TASK, "split": "train"},
            "dataloader": {"batch_size": 9, "shuffle": True},
            "optimizer": {"type": "Adam", "lr": 0.1},
            "terminal_conditions": {"epoch_limit": 4},
            "seed": 3,
        },
        "validation": {"task": {"type": TASK, "split": "validation"}},
        "pipeline": pipeline({"build_from": "inputs"}),
    }
    expdir = tmp_path_factory.mktemp("runs")
    result = torchloom.train(config, expdir=str(expdir), analysis=False, tensorboard=0)
    assert result.status == "epoch_limit"
    assert result.statistics["validation"]["accuracy"] == 1.0
    return result.run_dir


def test_vocabulary_lands_in_the_run_folder_built_from_training_only(run_dir: Path) -> None:
    saved = Vocabulary.read(run_dir / "artifacts" / "indexer" / "vocabulary.txt")
    expected = Vocabulary.build(text.split() for text, _ in 3 * [(t, 0) for t in PETS + MARKETS])
    assert saved == expected
    assert "zebra" not in saved and "quasar" not in saved and "cat" in saved
    assert saved.words[:3] == ("<PAD>", "<EOS>", "<UNK>")


def test_process_config_reads_the_saved_vocabulary(run_dir: Path, tmp_path: Path) -> None:
    vocabulary_file = run_dir / "artifacts" / "indexer" / "vocabulary.txt"
    config = {
        "name": "toy_texts_process",
        "validation": {"task": {"type": TASK, "split": "validation"}},
        "pipeline": {
            **pipeline({"vocabulary_file": str(vocabulary_file)}),
            "exporter": {"type": "StreamFileExporter", "input_streams": ["inputs", "word_indices"]},
        },
    }
    best = run_dir / "checkpoints" / "best.pt"
    processed = torchloom.process(
        config, section="validation", checkpoint=str(best), expdir=str(tmp_path)
    )
    assert processed.statistics["accuracy"] == 1.0
    with open(processed.folder / "exported_streams.csv", newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    words = Vocabulary.read(vocabulary_file).word_mappings
    zebra = [int(i) for i in rows[0]["word_indices"].split()]
    # "the zebra cat sleeps": the unknown word is <UNK> (2), the rest training indices.
    assert zebra[:4] == [words["the"], 2, words["cat"], words["sleeps"]]

    # Another vocabulary than the checkpoint's: refused, not silently misread.
    lines = vocabulary_file.read_text(encoding="utf-8").splitlines()
    lines[3], lines[4] = lines[4], lines[3]
    swapped = tmp_path / "swapped.txt"
    swapped.write_text("\n".join(lines) + "\n", encoding="utf-8")
    config["pipeline"]["indexer"]["vocabulary_file"] = str(swapped)
    with pytest.raises(ComponentError, match="checkpoint's vocabulary differs"):
        torchloom.process(config, section="validation", checkpoint=str(best), expdir=str(tmp_path))


def test_process_of_the_run_folder_rebuilds_the_same_vocabulary(run_dir: Path) -> None:
    processed = torchloom.process(run_dir, section="validation")
    assert processed.statistics["accuracy"] == 1.0
    assert (processed.folder / "artifacts" / "indexer" / "vocabulary.txt").is_file()


def test_check_reports_the_key_of_an_empty_vocabulary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "texts.yml"
    config.write_text(
        f"""training:
  task: {{type: "{TASK}"}}
pipeline:
  tokenizer: {{type: SentenceTokenizer}}
  indexer:
    type: SentenceIndexer
    min_count: 100
  bow: {{type: BOWEncoder}}
""",
        encoding="utf-8",
    )
    assert main(["check", str(config)]) == 2
    error = capsys.readouterr().err
    assert f"{config}:7: component 'indexer' (SentenceIndexer): the vocabulary is empty" in error
    assert "none of them at least 100 times (training stream 'inputs', 27 samples)" in error
