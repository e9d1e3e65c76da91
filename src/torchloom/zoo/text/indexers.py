"""Indexers: words <-> word indices (`SentenceIndexer`) and labels <-> class indices
(`LabelIndexer`), with vocabularies read from a file or built from the training data.

Both build their vocabulary once, when the pipeline is built, and every section (training,
validation, test) shares the component, so validation and test data are always indexed with
the training vocabulary. The vocabulary is written into the run folder (`artifacts()`) and
into every checkpoint (`get_extra_state`), and a checkpoint whose vocabulary differs from the
one built is refused: its weights would mean other words.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field

from torchloom.core.component import Batch, BuildContext, Component, ComponentParams
from torchloom.core.host_copies import host_to_device
from torchloom.core.streams import INTEGER, StreamSpec
from torchloom.errors import ComponentError, DataError, Problem, did_you_mean
from torchloom.zoo.text.tokenizer import TokenizationOptions, Tokenizer
from torchloom.zoo.text.vocabulary import (
    EOS,
    PAD,
    UNK,
    Vocabulary,
    VocabularyError,
    escape_word,
)


def _error(component: Component, key: str, message: str, suggestion: str = "") -> ComponentError:
    """A ComponentError at the config key `key` of `component` (its line when not set)."""
    where = component.where(key) if key else component.where()
    return ComponentError([Problem(where, component.label, message, suggestion)])


def training_values(component: Component, stream: str, key: str, otherwise: str) -> Iterator[Any]:
    """Every training sample's value of `stream` (the task's default or renamed name), or a
    ComponentError at the config key `key` when there is no training task (suggesting
    `otherwise`) or no such stream."""
    task = component.training_task()
    if task is None:
        message = "has nothing to build from: the config has no training task"
        raise _error(component, key, message, otherwise)
    outputs = task.output_specs()
    renamed = {task.stream_name(name): name for name in outputs}
    default = renamed.get(stream, stream if stream in outputs else None)
    if default is None:
        message = f"the training task ({type(task).__name__}) has no stream '{stream}'"
        streams = did_you_mean(stream, renamed) or f"its streams: {', '.join(sorted(renamed))}"
        raise _error(component, key, message, streams)
    return task.texts(default)


def _refuse_other(
    component: Component, what: str, saved: tuple[str, ...], own: tuple[str, ...]
) -> ComponentError:
    """The error for a checkpoint whose vocabulary (or label set) is not the one built."""
    first = next((i for i, (a, b) in enumerate(zip(saved, own, strict=False)) if a != b), None)
    detail = (
        f"entry {first} is '{saved[first]}' there but '{own[first]}' here"
        if first is not None
        else f"{len(saved)} entries there, {len(own)} here"
    )
    return _error(
        component,
        "",
        f"the checkpoint's {what} differs from the one built ({detail}), so its weights "
        "would mean other words",
        "build from the same training data, or point the component at the "
        f"{what} file the run saved in <run>/artifacts/{component.name}/",
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
            raise _error(
                self, "vocabulary_file", f"the vocabulary lacks {PAD}, which must be its first line"
            )
        if params.add_eos and self.vocabulary.eos_index is None:
            raise _error(
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
            raise _error(
                self,
                "vocabulary_file",
                f"cannot read vocabulary file '{path}': {error.strerror or error}",
                "train once to get <run>/artifacts/<name>/vocabulary.txt, or set it to null "
                "to build the vocabulary from the training data",
            ) from error
        except VocabularyError as error:
            line = f", line {error.line}" if error.line else ""
            raise _error(
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
                raise _error(
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
            raise _error(
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
            raise _refuse_other(self, "vocabulary", saved, self.vocabulary.words)

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


class LabelIndexerParams(ComponentParams):
    labels: list[str] | None = Field(
        None, min_length=1, description="The labels, in class-index order; null: see below."
    )
    from_global: bool = Field(
        False,
        description="Take the labels from the global `label_word_mappings` (label -> index, "
        "as tasks publish it; rename with `globals:`) instead of building them.",
    )
    build_from: str = Field(
        "labels",
        description="Training-task stream whose distinct values, sorted, are the labels, when "
        "neither `labels` nor `from_global` is given.",
    )
    ignore_index: int = Field(
        -100, description="Target of a label outside the label set (losses skip it)."
    )
    reverse: bool = Field(
        False, description="Reverse direction: `targets` (class indices) -> `labels`."
    )
    unknown_label: str = Field(
        UNK, description="Label written for an index outside the label set, in reverse mode."
    )


class LabelIndexer(Component):
    """Turns label words into class indices (`targets`), and back (`reverse: true`).

    The label set is `labels`, or the global `label_word_mappings` (`from_global: true`), or
    the distinct values of the training task's `build_from` stream sorted alphabetically. A
    label outside the set becomes `ignore_index` (-100, which NLLLoss/CrossEntropyLoss skip).
    The labels are written to `<run>/artifacts/<name>/labels.txt` and saved in checkpoints.

    Streams: `labels` (one label per sample) -> `targets` (int64 [batch]); reverse: `targets`
    -> `labels`. Publishes `num_classes` and `label_mappings` (label -> index).

    ```yaml
    pipeline:
      label_indexer: {type: LabelIndexer, labels: [business, entertainment, politics]}
      # or from the task's global, under another name for the number of classes:
      # label_indexer:
      #   {type: LabelIndexer, from_global: true, globals: {num_classes: label_count}}
    ```
    """

    Params = LabelIndexerParams
    params: LabelIndexerParams
    _device_probe: torch.Tensor
    PUBLISHES_GLOBALS = {
        "num_classes": "number of labels",
        "label_mappings": "label -> class index",
    }

    @classmethod
    def needed_globals(cls, params: Any) -> Mapping[str, str]:
        if params.from_global:
            return {"label_word_mappings": "label -> class index"}
        return {}

    def __init__(self, params: LabelIndexerParams, context: BuildContext) -> None:
        super().__init__(params, context)
        if params.labels is not None and params.from_global:
            raise _error(self, "from_global", "`labels` and `from_global` both give the labels")
        if params.labels is not None:
            labels = list(params.labels)
        elif params.from_global:
            labels = self._from_global(self.global_value("label_word_mappings"))
        else:
            labels = self._build()
        duplicates = sorted(label for label, n in Counter(labels).items() if n > 1)
        if duplicates:
            raise _error(self, "labels", f"labels listed twice: {duplicates}")
        self.labels: tuple[str, ...] = tuple(labels)
        self.mappings = {label: index for index, label in enumerate(self.labels)}
        self.register_buffer("_device_probe", torch.zeros(0), persistent=False)
        self.publish_global("num_classes", len(self.labels))
        self.publish_global("label_mappings", dict(self.mappings))

    def _from_global(self, mappings: Any) -> list[str]:
        if not isinstance(mappings, Mapping) or sorted(mappings.values()) != list(
            range(len(mappings))
        ):
            raise _error(
                self,
                "globals",
                "global 'label_word_mappings' is not a label -> index mapping with the "
                "indices 0..n-1",
            )
        return [str(label) for label, _ in sorted(mappings.items(), key=lambda item: item[1])]

    def _build(self) -> list[str]:
        values = set()
        otherwise = "give the labels with `labels: [...]` or `from_global: true`"
        for value in training_values(self, self.params.build_from, "build_from", otherwise):
            if not isinstance(value, str):
                raise _error(
                    self,
                    "build_from",
                    f"training stream '{self.params.build_from}' holds "
                    f"{type(value).__name__} values, not label words",
                )
            values.add(value)
        if not values:
            raise _error(
                self,
                "build_from",
                f"the training stream '{self.params.build_from}' holds no labels",
                "give the labels with `labels: [...]`",
            )
        return sorted(values)

    def artifacts(self) -> Mapping[str, str]:
        return {"labels.txt": "".join(escape_word(label) + "\n" for label in self.labels)}

    def get_extra_state(self) -> dict[str, Any]:
        return {"labels": list(self.labels)}

    def set_extra_state(self, state: Any) -> None:
        saved = tuple(state.get("labels", ())) if isinstance(state, Mapping) else ()
        if saved != self.labels:
            raise _refuse_other(self, "labels", saved, self.labels)

    def input_specs(self) -> dict[str, StreamSpec]:
        if self.params.reverse:
            return {"targets": StreamSpec(("batch",), INTEGER, "class index of each sample")}
        return {"labels": StreamSpec(("batch",), str, "label of each sample")}

    def output_specs(self) -> dict[str, StreamSpec]:
        if self.params.reverse:
            return {"labels": StreamSpec(("batch",), str, "label of each sample")}
        return {
            "targets": StreamSpec(
                ("batch",), torch.int64, f"class index ({self.params.ignore_index}: unknown)"
            )
        }

    def forward(self, inputs: Batch) -> Batch:
        if self.params.reverse:
            count = len(self.labels)
            return {
                "labels": [
                    self.labels[i] if 0 <= i < count else self.params.unknown_label
                    for i in inputs["targets"].tolist()
                ]
            }
        targets = [self.mappings.get(label, self.params.ignore_index) for label in inputs["labels"]]
        host = torch.tensor(targets, dtype=torch.int64)  # pinned on its way, as the indexer's
        return {"targets": host_to_device(host, self._device_probe.device)}
