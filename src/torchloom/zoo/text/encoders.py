"""Fixed encodings of word indices (one-hot vectors, bags of words), and the way back from a
distribution over the vocabulary to words."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from torchloom.core.component import Batch, BuildContext, Component, ComponentParams
from torchloom.core.streams import FLOATING, INTEGER, StreamSpec
from torchloom.errors import ComponentError
from torchloom.zoo.text.vocabulary import EOS, PAD

_PAD_INDEX = 0  # the SentenceIndexer's <PAD> is always index 0


class SentenceOneHotEncoderParams(ComponentParams):
    zero_padding: bool = Field(
        True, description="Encode <PAD> positions (index 0) as all-zero vectors."
    )


class SentenceOneHotEncoder(Component):
    """Every word index as a one-hot vector over the vocabulary.

    Streams: `word_indices` (int [batch, length]) -> `one_hot` (float32 [batch, length,
    vocabulary_size]); <PAD> positions are zero vectors unless `zero_padding: false`. Needs
    the global `vocabulary_size` (a `SentenceIndexer` publishes it).

    ```yaml
    pipeline:
      one_hot: {type: SentenceOneHotEncoder, streams: {one_hot: word_vectors}}
    ```
    """

    Params = SentenceOneHotEncoderParams
    params: SentenceOneHotEncoderParams
    NEEDS_GLOBALS = {"vocabulary_size": "number of vocabulary entries"}
    EXAMPLE_GLOBALS = {"vocabulary_size": 100}

    def __init__(self, params: SentenceOneHotEncoderParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.vocabulary_size = int(self.global_value("vocabulary_size"))

    def input_specs(self) -> dict[str, StreamSpec]:
        return {"word_indices": StreamSpec(("batch", -1), INTEGER, "word indices")}

    def output_specs(self) -> dict[str, StreamSpec]:
        return {
            "one_hot": StreamSpec(
                ("batch", -1, self.vocabulary_size), torch.float32, "one-hot word vectors"
            )
        }

    def forward(self, inputs: Batch) -> Batch:
        indices = inputs["word_indices"].long()
        one_hot = F.one_hot(indices, self.vocabulary_size).float()
        if self.params.zero_padding:
            one_hot[..., _PAD_INDEX] = 0.0
        return {"one_hot": one_hot}


class BOWEncoderParams(ComponentParams):
    mode: Literal["counts", "binary", "frequency"] = Field(
        "counts",
        description="counts: occurrences of every word; binary: 1 if it occurs; frequency: "
        "occurrences divided by the sample's number of (non-padding) tokens.",
    )


class BOWEncoder(Component):
    """A bag of words: the word indices of every sample as one vector over the vocabulary.

    <PAD> (index 0) is never counted, so the padding of a batch changes nothing. Streams:
    `word_indices` (int [batch, length]) -> `bow` (float32 [batch, vocabulary_size]). Needs
    the global `vocabulary_size`; give a classifier `input_size: vocabulary_size`.

    ```yaml
    pipeline:
      bow: {type: BOWEncoder, mode: frequency}
      classifier:
        type: FeedForwardNetwork
        hidden_sizes: [64]
        streams: {inputs: bow}
        globals: {input_size: vocabulary_size, prediction_size: num_classes}
    ```
    """

    Params = BOWEncoderParams
    params: BOWEncoderParams
    NEEDS_GLOBALS = {"vocabulary_size": "number of vocabulary entries"}
    EXAMPLE_GLOBALS = {"vocabulary_size": 100}

    def __init__(self, params: BOWEncoderParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.vocabulary_size = int(self.global_value("vocabulary_size"))

    def input_specs(self) -> dict[str, StreamSpec]:
        return {"word_indices": StreamSpec(("batch", -1), INTEGER, "word indices")}

    def output_specs(self) -> dict[str, StreamSpec]:
        return {
            "bow": StreamSpec(
                ("batch", self.vocabulary_size), torch.float32, f"bag of words ({self.params.mode})"
            )
        }

    def forward(self, inputs: Batch) -> Batch:
        indices = inputs["word_indices"].long()
        bow = torch.zeros(
            indices.shape[0], self.vocabulary_size, dtype=torch.float32, device=indices.device
        )
        bow.scatter_add_(1, indices, torch.ones(indices.shape, device=indices.device))
        bow[:, _PAD_INDEX] = 0.0
        if self.params.mode == "binary":
            bow = (bow > 0).float()
        elif self.params.mode == "frequency":
            bow = bow / bow.sum(dim=1, keepdim=True).clamp(min=1.0)
        return {"bow": bow}


class WordDecoderParams(ComponentParams):
    sequences: bool = Field(
        True,
        description="true: `predictions` hold a distribution per position, [batch, length, "
        "vocabulary], decoded to a word list per sample; false: one per sample, [batch, "
        "vocabulary], decoded to one word per sample.",
    )
    stop_at_eos: bool = Field(
        True, description="End every word list at its first <EOS> or <PAD> (sequences)."
    )


class WordDecoder(Component):
    """The most probable word of every distribution over the vocabulary (argmax).

    Streams: `predictions` (log-probabilities or scores, [batch, length, vocabulary] or with
    `sequences: false` [batch, vocabulary]) -> `outputs` (a word list per sample, or a word
    per sample). Needs the global `word_mappings` (a `SentenceIndexer` publishes it).

    ```yaml
    pipeline:
      decoder: {type: WordDecoder, streams: {outputs: predicted_words}}
    ```
    """

    Params = WordDecoderParams
    params: WordDecoderParams
    NEEDS_GLOBALS = {"word_mappings": "word -> index of every vocabulary entry"}
    EXAMPLE_GLOBALS = {"word_mappings": {PAD: 0, EOS: 1, "hello": 2, "world": 3}}

    def __init__(self, params: WordDecoderParams, context: BuildContext) -> None:
        super().__init__(params, context)
        mappings = self.global_value("word_mappings")
        if not isinstance(mappings, Mapping) or sorted(mappings.values()) != list(
            range(len(mappings))
        ):
            raise ComponentError.at(
                self.where("globals"),
                self.label,
                "global 'word_mappings' is not a word -> index mapping with the indices 0..n-1",
            )
        self.words = [str(w) for w, _ in sorted(mappings.items(), key=lambda item: item[1])]
        # Ends of a sequence: <EOS> and <PAD>, where the vocabulary has them.
        self.ends = {mappings[w] for w in (EOS, PAD) if w in mappings}

    def input_specs(self) -> dict[str, StreamSpec]:
        dims = (
            ("batch", -1, len(self.words)) if self.params.sequences else ("batch", len(self.words))
        )
        return {"predictions": StreamSpec(dims, FLOATING, "distributions over the vocabulary")}

    def output_specs(self) -> dict[str, StreamSpec]:
        if self.params.sequences:
            return {"outputs": StreamSpec(("batch", -1), str, "most probable words")}
        return {"outputs": StreamSpec(("batch",), str, "most probable word")}

    def forward(self, inputs: Batch) -> Batch:
        best = inputs["predictions"].argmax(dim=-1).tolist()
        if not self.params.sequences:
            return {"outputs": [self.words[i] for i in best]}
        outputs = []
        for row in best:
            words = []
            for index in row:
                if self.params.stop_at_eos and index in self.ends:
                    break
                words.append(self.words[index])
            outputs.append(words)
        return {"outputs": outputs}
