"""Text statistics over a whole set: corpus-level BLEU."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Literal

import torch
from pydantic import Field

from torchloom.core.component import (
    Batch,
    BuildContext,
    ComponentParams,
    Statistic,
)
from torchloom.core.host_copies import host_to_device
from torchloom.core.streams import FLOATING, StreamSpec


def ngram_counts(words: Sequence[Hashable], max_n: int) -> Counter[tuple[Hashable, ...]]:
    """How often every n-gram (1 <= n <= max_n) occurs in `words`."""
    return Counter(
        tuple(words[start : start + n])
        for n in range(1, max_n + 1)
        for start in range(len(words) - n + 1)
    )


def clipped_matches(
    candidate: Sequence[Hashable], reference: Sequence[Hashable], max_n: int
) -> tuple[list[int], list[int]]:
    """Per n: the candidate's n-grams found in the reference, each counted at most as often as
    the reference has it (the "modified" precision's numerator), and the candidate's n-grams
    (its denominator)."""
    candidate_counts = ngram_counts(candidate, max_n)
    clipped = candidate_counts & ngram_counts(reference, max_n)
    matches, possible = [0] * max_n, [0] * max_n
    for ngram, count in clipped.items():
        matches[len(ngram) - 1] += count
    for ngram, count in candidate_counts.items():
        possible[len(ngram) - 1] += count
    return matches, possible


def corpus_bleu(
    matches: Sequence[float],
    possible: Sequence[float],
    candidate_length: float,
    reference_length: float,
    smoothing: bool,
) -> float:
    """BLEU of a corpus from its summed counts (Papineni et al. 2002): the geometric mean of
    the modified n-gram precisions times the brevity penalty, both over the whole corpus.
    Smoothing adds one to the numerator and denominator of the precisions of n >= 2 (Lin
    and Och 2004)."""
    precisions = []
    for n, (matched, total) in enumerate(zip(matches, possible, strict=True)):
        if smoothing and n > 0:
            precisions.append((matched + 1) / (total + 1))
        elif matched == 0:
            return 0.0  # a zero precision makes the geometric mean zero
        else:
            precisions.append(matched / total)
    log_precision = sum(math.log(p) for p in precisions) / len(precisions)
    if candidate_length > reference_length:
        brevity = 1.0
    else:
        brevity = math.exp(1 - reference_length / candidate_length)
    return brevity * math.exp(log_precision)


class BLEUStatisticsParams(ComponentParams):
    max_n: int = Field(4, ge=1, le=4, description="Longest n-gram counted (BLEU-4 by default).")
    smoothing: bool = Field(
        False,
        description="Add one to the numerator and denominator of the n >= 2 precisions "
        "(Lin and Och 2004), so a corpus without any matching 4-gram still scores above 0.",
    )
    tokens: Literal["indices", "strings"] = Field(
        "indices",
        description="indices: `predictions` are word scores [batch, -1, vocabulary] (the "
        "highest-scoring word is taken) and `targets` word indices [batch, -1]; strings: "
        "both are words, [batch, -1] lists of strings.",
    )
    eos_index: int | None = Field(
        1,
        ge=0,
        description="With indices: a sentence ends before its first <EOS> (1 in "
        "SentenceIndexer's vocabulary); null: sentences run to the end of the row.",
    )
    pad_index: int | None = Field(
        0,
        ge=0,
        description="With indices: <PAD> (0 in SentenceIndexer's vocabulary), padding: never "
        "counted in a reference, nor after a prediction's last word; a predicted <PAD> before "
        "it is a wrong word. Negative indices (the ignore index -100) are never counted.",
    )
    unk_index: int | None = Field(
        2,
        ge=0,
        description="With indices: <UNK> (2 in SentenceIndexer's vocabulary), a reference word "
        "the vocabulary lacks: it counts in the reference's length and n-grams but no "
        "prediction matches it (a predicted <UNK> is not the unknown word); null: none.",
    )
    eos_token: str | None = Field(
        "<EOS>", description="With strings: a sentence ends before this word; null: no marker."
    )
    pad_token: str | None = Field(
        "<PAD>",
        description="With strings: padding, as pad_index (inside a prediction, a wrong word).",
    )
    unk_token: str | None = Field(
        "<UNK>", description="With strings: as unk_index, a reference word nothing matches."
    )


_PREDICTED_PAD = object()  # a predicted <PAD>, until it is known to be inside the sentence


class BLEUStatistics(Statistic):
    """Corpus-level BLEU (Papineni et al. 2002) of predicted word sequences against one
    reference each: the clipped n-gram matches, the n-gram counts and the lengths are summed
    over the whole set, and the precisions and the brevity penalty are computed once, from
    those sums, in `compute()`. It is NOT a mean of sentence scores (which weighs a short
    sentence like a long one and punishes every short sentence separately). An empty set
    gives NaN; a set whose predictions share no word with the references gives 0.

    Each sentence ends before its first <EOS>. <PAD> and negative (ignored) indices are
    dropped from the targets; a predicted <PAD> after the prediction's last word is padding,
    one before it a wrong word (it matches nothing). Counting n-grams happens on the CPU:
    the predicted indices are copied there once per batch.

    Streams in: `predictions` [batch, -1, -1] float (word scores or log-probabilities per
    step, e.g. a decoder's) and `targets` [batch, -1] int64 (the reference word indices);
    with `tokens: strings`, both are words, [batch, -1] lists of strings. Reports `bleu`
    (between 0 and 1).

    ```yaml
    pipeline:
      bleu:
        type: BLEUStatistics
        max_n: 4
        streams: {predictions: predictions, targets: target_indices}
    ```
    """

    Params = BLEUStatisticsParams
    params: BLEUStatisticsParams
    matches: torch.Tensor
    possible: torch.Tensor
    lengths: torch.Tensor

    def __init__(self, params: BLEUStatisticsParams, context: BuildContext) -> None:
        super().__init__(params, context)
        # Buffers: they follow the pipeline to its device and go into checkpoints, so a
        # resumed run goes on counting where it stopped.
        self.register_buffer("matches", torch.zeros(params.max_n, dtype=torch.int64))
        self.register_buffer("possible", torch.zeros(params.max_n, dtype=torch.int64))
        # [sentences, candidate words, reference words]
        self.register_buffer("lengths", torch.zeros(3, dtype=torch.int64))

    def input_specs(self) -> dict[str, StreamSpec]:
        if self.params.tokens == "strings":
            return {
                "predictions": StreamSpec(("batch", -1), str, "predicted words per sentence"),
                "targets": StreamSpec(("batch", -1), str, "reference words per sentence"),
            }
        return {
            "predictions": StreamSpec(("batch", -1, -1), FLOATING, "word scores per step"),
            "targets": StreamSpec(("batch", -1), torch.int64, "reference word indices"),
        }

    def _sentence(self, row: Sequence[Hashable], reference: bool = False) -> list[Hashable]:
        p = self.params
        end, pad, unknown = (
            (p.eos_token, p.pad_token, p.unk_token)
            if p.tokens == "strings"
            else (p.eos_index, p.pad_index, p.unk_index)
        )
        words: list[Hashable] = []
        for word in row:
            if end is not None and word == end:
                break
            if reference and unknown is not None and word == unknown:
                words.append(object())  # a word of its own: no n-gram of a prediction has it
            elif not reference and pad is not None and word == pad:
                # A predicted <PAD> is a wrong word, matching nothing (dropped, "a <PAD> b"
                # scored as "a b"); those after the prediction's last word are padding.
                words.append(_PREDICTED_PAD)
            elif word != pad and not (isinstance(word, int) and word < 0):
                words.append(word)
        while words and words[-1] is _PREDICTED_PAD:
            words.pop()
        return [object() if word is _PREDICTED_PAD else word for word in words]

    def update(self, inputs: Batch) -> None:
        predictions, targets = inputs["predictions"], inputs["targets"]
        if isinstance(predictions, torch.Tensor):
            predictions = predictions.argmax(dim=-1).tolist()
        if isinstance(targets, torch.Tensor):
            targets = targets.tolist()
        max_n = self.params.max_n
        matches, possible, lengths = [0] * max_n, [0] * max_n, [0, 0, 0]
        for predicted, target in zip(predictions, targets, strict=True):
            candidate, reference = self._sentence(predicted), self._sentence(target, True)
            sentence_matches, sentence_possible = clipped_matches(candidate, reference, max_n)
            matches = [a + b for a, b in zip(matches, sentence_matches, strict=True)]
            possible = [a + b for a, b in zip(possible, sentence_possible, strict=True)]
            lengths = [lengths[0] + 1, lengths[1] + len(candidate), lengths[2] + len(reference)]
        # One pinned, non-blocking copy: three tensors made on a GPU from lists were three
        # copies from pageable memory, each a wait for the GPU's queue.
        counts = host_to_device(torch.tensor(matches + possible + lengths), self.matches.device)
        self.matches += counts[:max_n]
        self.possible += counts[max_n : 2 * max_n]
        self.lengths += counts[2 * max_n :]

    def compute(self) -> dict[str, float]:
        sentences, candidate_length, reference_length = self.lengths.tolist()
        if sentences == 0:
            return {"bleu": float("nan")}
        if candidate_length == 0:
            return {"bleu": 0.0}  # nothing predicted: no precision, and all brevity
        bleu = corpus_bleu(
            self.matches.tolist(),
            self.possible.tolist(),
            candidate_length,
            reference_length,
            self.params.smoothing,
        )
        return {"bleu": bleu}

    def merge(self, other: Statistic) -> None:
        assert isinstance(other, BLEUStatistics)
        self.add_buffers_of(other)  # matches, possible, lengths: all counts

    def reset(self) -> None:
        self.matches.zero_()
        self.possible.zero_()
        self.lengths.zero_()
