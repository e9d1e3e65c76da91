"""Words <-> word indices (`SentenceIndexer`), with a vocabulary read from a file or built from
the training data (labels <-> class indices: `LabelIndexer`, label_indexer.py).

The vocabulary is built once, when the pipeline is built, and every section (training,
validation, test) shares the component, so validation and test data are always indexed with
the training vocabulary. The vocabulary is written into the run folder (`artifacts()`) and
into every checkpoint (`get_extra_state`), and a checkpoint whose vocabulary differs from the
one built is refused: its weights would mean other words.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field

from torchloom.core.component import Batch, BuildContext, Component
from torchloom.core.file_names import READS_A_PATH
from torchloom.core.host_copies import host_to_device
from torchloom.core.streams import INTEGER, StreamSpec
from torchloom.errors import DataError
from torchloom.zoo.text.fitting import fit_error, refuse_other_entries, training_values
from torchloom.zoo.text.tokenizer import TokenizationOptions, Tokenizer
from torchloom.zoo.text.vocabulary import (
    EOS,
    PAD,
    UNK,
    Vocabulary,
    VocabularyError,
)

SpecialWord = Literal["<EOS>", "<UNK>"]


def _default_specials() -> list[SpecialWord]:
    return ["<EOS>", "<UNK>"]


class SentenceIndexerParams(TokenizationOptions):
    vocabulary_file: str | None = Field(
        None,
        description="Vocabulary file to read (one word per line, index order, <PAD> first), "
        "e.g. the `<run>/artifacts/<name>/vocabulary.txt` a training run wrote; null builds "
        "the vocabulary from the training data.",
        json_schema_extra=READS_A_PATH,
    )
    build_from: str = Field(
        "inputs",
        description="Training-task stream the vocabulary is built from: texts are tokenized "
        "with this component's tokenization options (mode, lowercase, ...), token lists are "
        "used as they are.",
    )
    min_count: int = Field(1, ge=1, description="Keep words seen at least this many times.")
    max_size: int | None = Field(
        None, gt=0, description="Most entries of a built vocabulary, special words included."
    )
    specials: list[SpecialWord] = Field(
        default_factory=_default_specials,
        description="Special words of a built vocabulary besides <PAD> (always index 0); "
        "without <UNK> an unknown word is an error.",
    )
    add_eos: bool = Field(False, description="End every sequence with <EOS>.")
    sequence_length: int | None = Field(
        None,
        gt=0,
        description="Pad or truncate every sequence to this length; null pads to the longest "
        "sequence of each batch.",
    )
    reverse: bool = Field(
        False,
        description="Reverse direction: `word_indices` -> `tokens`, each sequence ending at "
        "its first <EOS> or <PAD>.",
    )


class SentenceIndexer(Component):
    """Turns token lists into padded tensors of word indices, and back (`reverse: true`).

    The vocabulary is read from `vocabulary_file`, or built from the training task's
    `build_from` stream (words seen `min_count` times, most frequent first, at most
    `max_size`), tokenized with the same options as a `SentenceTokenizer` (give both the same
    `mode`, `lowercase`, ...). Index 0 is <PAD>, then <EOS> and <UNK> (see `specials`); an
    unknown word becomes <UNK>. The vocabulary is written to
    `<run>/artifacts/<name>/vocabulary.txt`, which a later config can name as
    `vocabulary_file`, and it is saved in checkpoints.

    Streams: `tokens` (a list of tokens per sample) -> `word_indices` (int64 [batch, length],
    padded with <PAD>) and `lengths` (int64 [batch], without padding). Reverse:
    `word_indices` -> `tokens`. Publishes `vocabulary_size` and `word_mappings` (word -> index).

    ```yaml
    pipeline:
      tokenizer: {type: SentenceTokenizer, remove_punctuation: true}
      indexer:
        type: SentenceIndexer
        build_from: inputs          # the training task's texts
        remove_punctuation: true    # the tokenizer's options, so both cut texts alike
        min_count: 2
        add_eos: true
      # in a later config: vocabulary_file: runs/<run>/artifacts/indexer/vocabulary.txt
    ```
    """

    Params = SentenceIndexerParams
    params: SentenceIndexerParams
    _device_probe: torch.Tensor
    PUBLISHES_GLOBALS = {
        "vocabulary_size": "number of entries of the vocabulary, special words included",
        "word_mappings": "word -> index of every vocabulary entry",
    }

    def __init__(self, params: SentenceIndexerParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.vocabulary = self._read() if params.vocabulary_file else self._build()
        if self.vocabulary.pad_index != 0:
            raise fit_error(
                self, "vocabulary_file", f"the vocabulary lacks {PAD}, which must be its first line"
            )
        if params.add_eos and self.vocabulary.eos_index is None:
            raise fit_error(
                self, "add_eos", f"the vocabulary has no {EOS} to add", f"add {EOS} to `specials`"
            )
        # Outputs are made where the pipeline runs: a non-persistent buffer follows .to().
        self.register_buffer("_device_probe", torch.zeros(0), persistent=False)
        self.publish_global("vocabulary_size", len(self.vocabulary))
        self.publish_global("word_mappings", self.vocabulary.word_mappings)

    def _read(self) -> Vocabulary:
        path = Path(str(self.params.vocabulary_file)).expanduser()
        try:
            return Vocabulary.read(path)
        except OSError as error:
            raise fit_error(
                self,
                "vocabulary_file",
                f"cannot read vocabulary file '{path}': {error.strerror or error}",
                "train once to get <run>/artifacts/<name>/vocabulary.txt, or set it to null "
                "to build the vocabulary from the training data",
            ) from error
        except VocabularyError as error:
            line = f", line {error.line}" if error.line else ""
            raise fit_error(
                self, "vocabulary_file", f"vocabulary file '{path}'{line}: {error.message}"
            ) from error

    def _build(self) -> Vocabulary:
        tokenizer = Tokenizer(self.params)
        counts: Counter[str] = Counter()
        texts = 0
        otherwise = "set vocabulary_file, e.g. to the vocabulary.txt a training run saved"
        for value in training_values(self, self.params.build_from, "build_from", otherwise):
            texts += 1
            if isinstance(value, str):
                counts.update(tokenizer(value))
            elif isinstance(value, (list, tuple)) and all(isinstance(t, str) for t in value):
                counts.update(value)
            else:
                raise fit_error(
                    self,
                    "build_from",
                    f"training stream '{self.params.build_from}' holds "
                    f"{type(value).__name__} values, not texts or token lists",
                )
        try:
            return Vocabulary.from_counts(
                counts, [PAD, *self.params.specials], self.params.min_count, self.params.max_size
            )
        except VocabularyError as error:
            key = "max_size" if "max_size" in error.message else "min_count"
            key = key if counts else "build_from"
            raise fit_error(
                self,
                key,
                f"{error.message} (training stream '{self.params.build_from}', {texts} samples)",
                "lower min_count, or check the stream and the tokenization options",
            ) from error

    # ---- the run folder and checkpoints -----------------------------------------------------
    def artifacts(self) -> Mapping[str, str]:
        return {"vocabulary.txt": self.vocabulary.to_text()}

    def get_extra_state(self) -> dict[str, Any]:
        return {"vocabulary": list(self.vocabulary.words)}

    def set_extra_state(self, state: Any) -> None:
        saved = tuple(state.get("vocabulary", ())) if isinstance(state, Mapping) else ()
        if saved != self.vocabulary.words:
            raise refuse_other_entries(self, "vocabulary", saved, self.vocabulary.words)

    # ---- streams ----------------------------------------------------------------------------
    def input_specs(self) -> dict[str, StreamSpec]:
        if self.params.reverse:
            return {"word_indices": StreamSpec(("batch", -1), INTEGER, "word indices")}
        return {"tokens": StreamSpec(("batch", -1), str, "tokens of each sample")}

    def output_specs(self) -> dict[str, StreamSpec]:
        if self.params.reverse:
            return {"tokens": StreamSpec(("batch", -1), str, "words up to <EOS>/<PAD>")}
        length = self.params.sequence_length or -1
        return {
            "word_indices": StreamSpec(
                ("batch", length), torch.int64, f"word indices, padded with {PAD} (0)"
            ),
            "lengths": StreamSpec(("batch",), torch.int64, "number of indices before padding"),
        }

    def forward(self, inputs: Batch) -> Batch:
        if self.params.reverse:
            rows = inputs["word_indices"].tolist()
            return {"tokens": [self.vocabulary.decode(row) for row in rows]}
        try:
            sequences = [
                self.vocabulary.encode(tokens, self.params.add_eos) for tokens in inputs["tokens"]
            ]
        except VocabularyError as error:
            raise DataError.at(
                self.where(), self.label, error.message, f"add {UNK} to `specials`"
            ) from error
        limit = self.params.sequence_length
        if limit is not None:
            sequences = [sequence[:limit] for sequence in sequences]
        width = limit or max([1, *(len(s) for s in sequences)])
        padded = [sequence + [0] * (width - len(sequence)) for sequence in sequences]
        # Made on the host, copied pinned: made on a GPU from lists, each waited for its queue.
        device = self._device_probe.device
        indices = torch.tensor(padded, dtype=torch.int64).view(-1, width)
        lengths = torch.tensor([len(s) for s in sequences], dtype=torch.int64)
        return {
            "word_indices": host_to_device(indices, device),
            "lengths": host_to_device(lengths, device),
        }
