"""IndexEmbeddings and SentenceEmbeddings (pretrained GloVe / word2vec initialisation)."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from torchloom.cli.main import main
from torchloom.errors import ComponentError
from torchloom.zoo.text.embeddings import IndexEmbeddings, SentenceEmbeddings

MAPPINGS = {"<PAD>": 0, "<EOS>": 1, "<UNK>": 2, "cat": 3, "Dog": 4, "zebra": 5}
GLOBALS = {"vocabulary_size": 6, "word_mappings": MAPPINGS}
# A small file in the real GloVe format; "<unk>" must not be taken for the special <UNK>.
GLOVE = "the 1 1 1\ncat 0.5 -0.5 2\ndog 3 2 1\n<unk> 9 9 9\n"


@pytest.fixture
def glove(tmp_path: Path) -> Path:
    path = tmp_path / "glove.toy.3d.txt"
    path.write_text(GLOVE, encoding="utf-8")
    return path


def embeddings(path: Path, **params: Any) -> SentenceEmbeddings:
    built = SentenceEmbeddings.create(
        pretrained_file=str(path),
        embeddings_size=params.pop("embeddings_size", 3),
        globals=GLOBALS,
        **params,
    )
    assert isinstance(built, SentenceEmbeddings)
    return built


def test_index_embeddings_pad_is_zero_and_untrained() -> None:
    layer = IndexEmbeddings.create(embeddings_size=4, globals={"vocabulary_size": 6})
    out = layer({"word_indices": torch.tensor([[3, 0], [5, 1]])})["embeddings"]
    assert out.shape == (2, 2, 4) and out.dtype == torch.float32
    assert torch.all(out[0, 1] == 0)
    out.sum().backward()
    assert torch.all(layer.embeddings.weight.grad[0] == 0)
    assert layer._context.store.get("embeddings_size", "t") == 4
    assert str(layer.output_specs()["embeddings"]) == "[batch, -1, 4] float32"


def test_pretrained_vectors_copied_and_coverage_noted(glove: Path) -> None:
    layer = embeddings(glove)
    weight = layer.embeddings.weight.detach()
    assert weight[3].tolist() == [0.5, -0.5, 2.0]
    assert weight[4].tolist() == [3.0, 2.0, 1.0]  # "Dog" found as "dog"
    assert torch.all(weight[0] == 0)
    assert not torch.equal(weight[2], torch.tensor([9.0, 9.0, 9.0]))  # <UNK> is not "<unk>"
    assert layer.coverage == (2, 3)
    assert layer.coverage_text == f"2 of 3 words (66.7%) found in {glove}"
    # A build note: `loom check` prints it and a run writes it to its log.
    assert layer.build_notes == [f"2 of 3 words (66.7%) found in {glove}"]


def test_missing_words_seeded_normal_or_zeros(glove: Path) -> None:
    first, again = embeddings(glove), embeddings(glove)
    assert torch.equal(first.embeddings.weight, again.embeddings.weight)
    other = embeddings(glove, seed=1)
    assert not torch.equal(first.embeddings.weight[5], other.embeddings.weight[5])
    # Default scale: the standard deviation of the vectors found.
    scaled = embeddings(glove, missing_std=1e-6)
    assert scaled.embeddings.weight[5].abs().max() < 1e-4
    zeros = embeddings(glove, missing_words="zeros")
    assert torch.all(zeros.embeddings.weight[[1, 2, 5]] == 0)


def test_freeze_pretrained_keeps_file_vectors_even_with_weight_decay(glove: Path) -> None:
    layer = embeddings(glove, freeze_pretrained=True)
    before = layer({"word_indices": torch.arange(6)[None]})["embeddings"].detach().clone()
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1, weight_decay=0.5)
    for _ in range(3):
        optimizer.zero_grad()
        layer({"word_indices": torch.tensor([[3, 4, 5, 2, 0]])})["embeddings"].pow(
            2
        ).sum().backward()
        optimizer.step()
    after = layer({"word_indices": torch.arange(6)[None]})["embeddings"].detach()
    assert torch.equal(after[0, [0, 3, 4]], before[0, [0, 3, 4]])  # <PAD>, cat, Dog fixed
    assert not torch.equal(after[0, 5], before[0, 5])  # zebra trains
    assert not torch.equal(after[0, 2], before[0, 2])  # <UNK> trains


def test_reads_a_member_of_a_zip_by_dimension(tmp_path: Path) -> None:
    path = tmp_path / "glove.toy.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("glove.toy.3d.txt", GLOVE)
        archive.writestr("glove.toy.2d.txt", "cat 1 2\n")
    layer = embeddings(path, embeddings_size=2)
    assert layer.embeddings.weight[3].tolist() == [1.0, 2.0]
    assert layer.coverage_text.endswith("glove.toy.zip:glove.toy.2d.txt")


def test_dimension_mismatch_and_missing_file_name_the_key(glove: Path, tmp_path: Path) -> None:
    with pytest.raises(
        ComponentError, match="holds 3-dimensional vectors but embeddings_size is 5"
    ):
        embeddings(glove, embeddings_size=5)
    with pytest.raises(ComponentError, match=r"does not exist.*set `download: true`"):
        embeddings(tmp_path / "glove.6B.zip")
    with pytest.raises(ComponentError, match="does not exist"):
        embeddings(tmp_path / "nothing.txt")


def test_check_names_the_config_line(glove: Path, tmp_path: Path, capsys: Any) -> None:
    vocabulary = tmp_path / "vocabulary.txt"
    vocabulary.write_text("<PAD>\n<UNK>\ncat\n", encoding="utf-8")
    config = tmp_path / "glove.yml"
    config.write_text(
        f"""pipeline:
  indexer: {{type: SentenceIndexer, vocabulary_file: "{vocabulary}"}}
  embeddings:
    type: SentenceEmbeddings
    pretrained_file: "{glove}"
    embeddings_size: 50
""",
        encoding="utf-8",
    )
    assert main(["check", str(config)]) == 2
    error = capsys.readouterr().err
    assert f"{config}:6: component 'embeddings' (SentenceEmbeddings): '{glove}' holds " in error
    assert "3-dimensional vectors but embeddings_size is 50 (set embeddings_size: 3" in error
