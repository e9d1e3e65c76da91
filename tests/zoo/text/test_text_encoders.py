"""SentenceOneHotEncoder, BOWEncoder and WordDecoder against hand computations."""

from __future__ import annotations

import pytest
import torch

from torchloom.errors import ComponentError
from torchloom.zoo.text.encoders import BOWEncoder, SentenceOneHotEncoder, WordDecoder

INDICES = torch.tensor([[3, 4, 3, 1, 0], [2, 0, 0, 0, 0], [0, 0, 0, 0, 0]])


def test_one_hot_with_zero_padding() -> None:
    encoder = SentenceOneHotEncoder.create(globals={"vocabulary_size": 5})
    one_hot = encoder({"word_indices": INDICES[:2, :3]})["one_hot"]
    assert one_hot.shape == (2, 3, 5) and one_hot.dtype == torch.float32
    assert one_hot[0].tolist() == [[0, 0, 0, 1, 0], [0, 0, 0, 0, 1], [0, 0, 0, 1, 0]]
    assert one_hot[1, 1].sum() == 0  # <PAD>
    padded = SentenceOneHotEncoder.create(zero_padding=False, globals={"vocabulary_size": 5})
    assert padded({"word_indices": INDICES[1:2, :2]})["one_hot"][0, 1].tolist() == [1, 0, 0, 0, 0]
    assert str(encoder.output_specs()["one_hot"]) == "[batch, -1, 5] float32"


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("counts", [[0, 1, 0, 2, 1], [0, 0, 1, 0, 0], [0, 0, 0, 0, 0]]),
        ("binary", [[0, 1, 0, 1, 1], [0, 0, 1, 0, 0], [0, 0, 0, 0, 0]]),
        ("frequency", [[0, 0.25, 0, 0.5, 0.25], [0, 0, 1, 0, 0], [0, 0, 0, 0, 0]]),
    ],
)
def test_bag_of_words_never_counts_padding(mode: str, expected: list[list[float]]) -> None:
    encoder = BOWEncoder.create(mode=mode, globals={"vocabulary_size": 5})
    bow = encoder({"word_indices": INDICES})["bow"]
    assert bow.dtype == torch.float32
    assert bow.tolist() == expected
    # More padding changes nothing.
    wider = torch.cat([INDICES, torch.zeros(3, 4, dtype=torch.int64)], dim=1)
    assert torch.equal(encoder({"word_indices": wider})["bow"], bow)
    assert str(encoder.output_specs()["bow"]) == "[batch, 5] float32"


MAPPINGS = {"<PAD>": 0, "<EOS>": 1, "<UNK>": 2, "hello": 3, "world": 4}


def test_word_decoder_sequences_stop_at_eos() -> None:
    decoder = WordDecoder.create(globals={"word_mappings": MAPPINGS})
    best = torch.tensor([[3, 4, 1, 3], [4, 0, 3, 3]])
    log_probs = torch.log_softmax(torch.nn.functional.one_hot(best, 5).float() * 5, dim=-1)
    assert decoder({"predictions": log_probs}) == {"outputs": [["hello", "world"], ["world"]]}
    keep = WordDecoder.create(stop_at_eos=False, globals={"word_mappings": MAPPINGS})
    assert keep({"predictions": log_probs})["outputs"][0] == ["hello", "world", "<EOS>", "hello"]
    assert str(decoder.input_specs()["predictions"]).startswith("[batch, -1, 5] float32")


def test_word_decoder_one_word_per_sample_and_bad_mappings() -> None:
    decoder = WordDecoder.create(sequences=False, globals={"word_mappings": MAPPINGS})
    scores = torch.tensor([[0.0, 0, 0, 0, 1], [0, 0, 0, 2, 1]])
    assert decoder({"predictions": scores}) == {"outputs": ["world", "hello"]}
    assert str(decoder.output_specs()["outputs"]) == "[batch] str"
    with pytest.raises(ComponentError, match="word_mappings"):
        WordDecoder.create(globals={"word_mappings": {"a": 1}})
