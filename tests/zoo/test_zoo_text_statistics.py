"""BLEUStatistics: corpus-level BLEU from summed counts, equal to a hand computation and to
torchmetrics' BLEUScore, and different from a mean of sentence scores."""

from __future__ import annotations

import math

import pytest
import torch
from torchmetrics.text import BLEUScore

from torchloom.zoo.text_statistics import BLEUStatistics, clipped_matches

EOS, PAD = 1, 0


def as_scores(rows: list[list[int]], vocabulary: int = 20) -> torch.Tensor:
    """Log-probabilities [batch, steps, vocabulary] whose best word is rows[i][t] (rows padded
    with <PAD>)."""
    steps = max(len(row) for row in rows)
    indices = torch.tensor([row + [PAD] * (steps - len(row)) for row in rows])
    return torch.log_softmax(torch.nn.functional.one_hot(indices, vocabulary) * 5.0, dim=-1)


def as_targets(rows: list[list[int]]) -> torch.Tensor:
    steps = max(len(row) for row in rows)
    return torch.tensor([row + [PAD] * (steps - len(row)) for row in rows])


def bleu_of(candidates: list[list[int]], references: list[list[int]], **params: object) -> float:
    statistic = BLEUStatistics.create(**params)
    statistic.update({"predictions": as_scores(candidates), "targets": as_targets(references)})
    return statistic.compute()["bleu"]


def words(row: list[int]) -> str:
    return " ".join(f"w{index}" for index in row)


# "the cat sat on the mat" / "the cat is on the mat", and a short candidate of a longer one.
CANDIDATES = [[3, 4, 5, 6, 3, 7], [9, 10]]
REFERENCES = [[3, 4, 8, 6, 3, 7], [9, 10, 11, 12]]


def test_bleu_equals_a_hand_computation() -> None:
    # Unigrams: the x2, cat, on, mat match (5 of 6), then 2 of 2: 7 of 8.
    # Bigrams: the-cat, on-the, the-mat (3 of 5), then 1 of 1: 4 of 6.
    # Lengths over the corpus: 8 predicted, 10 reference words: brevity exp(1 - 10/8).
    expected = math.exp(1 - 10 / 8) * math.sqrt((7 / 8) * (4 / 6))
    assert bleu_of(CANDIDATES, REFERENCES, max_n=2) == pytest.approx(expected, rel=1e-12)
    assert clipped_matches([3, 3, 3], [3, 4], 2) == ([1, 0], [3, 2])  # clipped at the ref's 1


def test_sentences_end_at_eos_and_padding_is_never_counted() -> None:
    expected = bleu_of(CANDIDATES, REFERENCES, max_n=2)
    # A prediction's <PAD>s after its last word are padding (one before it is a wrong word:
    # test_a_predicted_pad_inside_the_sentence_is_a_wrong_word).
    noisy_candidates = [[3, 4, 5, 6, 3, 7, EOS, 3, 4], [9, 10, PAD, PAD, EOS, 9]]
    noisy_references = [[3, 4, 8, 6, 3, 7, EOS], [9, 10, 11, 12, EOS, PAD, 5]]
    assert bleu_of(noisy_candidates, noisy_references, max_n=2) == pytest.approx(expected)
    targets = as_targets([[3, 4, 8, 6, 3, 7, EOS, -100], [9, 10, 11, 12, -100, -100, -100, -100]])
    statistic = BLEUStatistics.create(max_n=2)
    statistic.update({"predictions": as_scores(CANDIDATES), "targets": targets})
    assert statistic.compute()["bleu"] == pytest.approx(expected)


def random_corpus(size: int, seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """References of 3..12 words over a small vocabulary, and candidates that copy them with
    some words replaced, dropped or added: a corpus with partial n-gram matches."""
    generator = torch.Generator().manual_seed(seed)
    candidates, references = [], []
    for _ in range(size):
        length = int(torch.randint(3, 13, (1,), generator=generator))
        reference = torch.randint(3, 15, (length,), generator=generator).tolist()
        candidate = []
        for word in reference:
            draw = float(torch.rand(1, generator=generator))
            if draw < 0.15:
                candidate.append(int(torch.randint(3, 15, (1,), generator=generator)))
            elif draw < 0.2:
                continue
            else:
                candidate.append(word)
                if draw > 0.95:
                    candidate.append(word)
        candidates.append(candidate or [3])
        references.append(reference)
    return candidates, references


@pytest.mark.parametrize(("max_n", "smoothing"), [(4, False), (4, True), (2, False), (1, False)])
def test_bleu_agrees_with_torchmetrics_on_the_same_corpus(max_n: int, smoothing: bool) -> None:
    candidates, references = random_corpus(40, seed=max_n + 10 * smoothing)
    statistic = BLEUStatistics.create(max_n=max_n, smoothing=smoothing)
    for start in range(0, 40, 7):  # batches of 7 (the last one of 5)
        statistic.update(
            {
                "predictions": as_scores(candidates[start : start + 7]),
                "targets": as_targets(references[start : start + 7]),
            }
        )
    reference_metric = BLEUScore(n_gram=max_n, smooth=smoothing)
    expected = float(
        reference_metric([words(c) for c in candidates], [[words(r)] for r in references])
    )
    assert 0.2 < expected < 0.9  # a corpus with partial matches, not a trivial 0 or 1
    assert statistic.compute()["bleu"] == pytest.approx(expected, rel=1e-6)


def test_corpus_bleu_is_not_a_mean_of_sentence_scores() -> None:
    candidates = [[3, 4, 5, 6, 7, 8, 9, 10], [11, 12]]
    references = [[3, 4, 5, 6, 7, 8, 9, 10], [11, 13]]
    corpus = bleu_of(candidates, references, max_n=2)
    sentences = [bleu_of([c], [r], max_n=2) for c, r in zip(candidates, references, strict=True)]
    # Corpus: unigrams 9/10, bigrams 7/8, no brevity penalty; sentences: 1.0 and 0.0.
    assert corpus == pytest.approx(math.sqrt(0.9 * 7 / 8))
    assert sentences == [pytest.approx(1.0), 0.0]
    assert corpus != pytest.approx(sum(sentences) / len(sentences))
    assert float(
        BLEUScore(n_gram=2)([words(c) for c in candidates], [[words(r)] for r in references])
    ) == pytest.approx(corpus)


def test_smoothing_gives_credit_without_higher_order_matches() -> None:
    # Unigram matches, no bigram match: 0 without smoothing; with add-one smoothing of the
    # bigram precision: sqrt(2/2 * (0 + 1) / (1 + 1)). (torchmetrics returns 0 here even when
    # smoothing: it checks for a zero count before smoothing.)
    assert bleu_of([[4, 3]], [[3, 4]], max_n=2) == 0.0
    smoothed = bleu_of([[4, 3]], [[3, 4]], max_n=2, smoothing=True)
    assert smoothed == pytest.approx(math.sqrt(1.0 * 1 / 2))


def test_empty_sets_give_nan_reset_starts_over_and_state_survives_a_checkpoint() -> None:
    statistic = BLEUStatistics.create()
    assert math.isnan(statistic.compute()["bleu"])
    statistic.update({"predictions": as_scores([[EOS]]), "targets": as_targets([[3, 4]])})
    assert statistic.compute() == {"bleu": 0.0}  # nothing predicted
    statistic.reset()
    assert math.isnan(statistic.compute()["bleu"])
    statistic.update({"predictions": as_scores(CANDIDATES), "targets": as_targets(REFERENCES)})
    restored = BLEUStatistics.create()
    restored.load_state_dict(statistic.state_dict())
    assert restored.compute() == statistic.compute()


def test_string_tokens() -> None:
    statistic = BLEUStatistics.create(tokens="strings", max_n=2)
    spec = statistic.input_specs()["predictions"]
    assert spec.dtypes == (str,) and spec.shape_text() == "[batch, -1]"
    candidates = [["the", "cat", "sat", "on", "the", "mat", "<EOS>", "x"], ["a", "b"]]
    references = [["the", "cat", "is", "on", "the", "mat"], ["a", "b", "c", "d", "<PAD>"]]
    statistic.update({"predictions": candidates, "targets": references})
    expected = math.exp(1 - 10 / 8) * math.sqrt((7 / 8) * (4 / 6))
    assert statistic.compute()["bleu"] == pytest.approx(expected)


def test_index_specs() -> None:
    specs = BLEUStatistics.create().input_specs()
    assert specs["predictions"].shape_text() == "[batch, -1, -1]"
    assert specs["targets"].shape_text() == "[batch, -1]"
    assert specs["targets"].dtypes == (torch.int64,)


def test_copies_add_each_others_counts() -> None:
    """The epoch's and the logging interval's copies in training, and several processes'
    shares of a set: the sums of their counts are the corpus's BLEU."""
    candidates, references = random_corpus(30, seed=5)
    whole, first, second = (BLEUStatistics.create(max_n=2) for _ in range(3))
    assert first.can_merge
    for statistic, part in ((whole, slice(0, 30)), (first, slice(0, 12)), (second, slice(12, 30))):
        statistic.update(
            {"predictions": as_scores(candidates[part]), "targets": as_targets(references[part])}
        )
    first.merge(second)
    assert first.compute() == whole.compute()
    assert first.compute() != second.compute()


def test_a_step_s_counts_reach_the_device_in_one_copy_from_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three tensors made on a GPU from lists were three copies from pageable memory a step,
    each a wait for the GPU's queue: now one host tensor, copied through `host_to_device`
    (pinned, non-blocking). The meta device stands in for the GPU."""
    import torchloom.zoo.text_statistics as module

    copied: list[torch.Tensor] = []
    original = module.host_to_device

    def host_to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
        copied.append(host)
        return original(host, device)

    monkeypatch.setattr(module, "host_to_device", host_to_device)
    on_host = BLEUStatistics.create(max_n=2)
    on_host.update({"predictions": as_scores(CANDIDATES), "targets": as_targets(REFERENCES)})
    assert [t.device.type for t in copied] == ["cpu"]
    assert copied[0].tolist() == [*on_host.matches, *on_host.possible, *on_host.lengths]
    on_meta = BLEUStatistics.create(max_n=2).to("meta")
    on_meta.update({"predictions": as_scores(CANDIDATES), "targets": as_targets(REFERENCES)})
    assert len(copied) == 2 and on_meta.matches.device.type == "meta"


def test_a_reference_word_out_of_the_vocabulary_matches_no_prediction() -> None:
    """References index words the vocabulary lacks as <UNK> (2): a predicted <UNK> matched
    them, so a decoder that wrote <UNK> for every rare word scored a perfect 1.0."""
    UNK = 2
    sentence = [3, UNK, UNK, 4, 1]  # two words outside the vocabulary, then <EOS>
    assert bleu_of([sentence], [sentence], max_n=2) < 1.0
    assert bleu_of([sentence], [sentence], max_n=2, unk_index=None) == 1.0  # as before
    assert bleu_of([[3, 5, 4]], [[3, 5, 4]], max_n=2) == 1.0  # known words still match


def test_a_predicted_pad_inside_the_sentence_is_a_wrong_word() -> None:
    """A decoder that wrote <PAD> where the reference has a word was scored as if the word
    were not there: "a <PAD> b" against "a b" gave a perfect 1.0. Inside a prediction it is a
    word that matches nothing; only the <PAD>s after its last word are padding."""
    assert bleu_of([[3, PAD, 4, EOS]], [[3, 4, EOS]], max_n=2) < 1.0
    assert bleu_of([[3, 4, PAD, PAD]], [[3, 4, EOS]], max_n=2) == 1.0  # trailing padding
    statistic = BLEUStatistics.create(max_n=2)
    statistic.update({"predictions": as_scores([[3, PAD, 4]]), "targets": as_targets([[3, 4]])})
    assert statistic.lengths.tolist() == [1, 3, 2]  # the predicted <PAD> counts as a word
