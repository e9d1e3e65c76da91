"""Translation: sentence pairs from tab-separated files, the manythings.org (Tatoeba) format."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, PositiveInt

from torchloom.core.component import Batch, BuildContext
from torchloom.core.streams import StreamSpec
from torchloom.data.text_sources import (
    collate_text_samples,
    dedupe_key,
    normalize_spaces,
    read_lines,
    split_positions,
)
from torchloom.errors import DataError
from torchloom.zoo.tasks.drawn_split import (
    DrawnSplitParams,
    DrawnSplitTask,
    TextEncodingParams,
)
from torchloom.zoo.tasks.language_modeling import WORD_PATTERN

LAYOUT = (
    "one sentence pair per line, source and target separated by a tab, optionally followed by "
    "a tab and an attribution (the manythings.org format: 'Go.\\tVa !\\tCC-BY 2.0 ...')"
)
SOURCE = (
    "the files of https://www.manythings.org/anki/ (e.g. fra-eng.zip holds fra.txt; the site "
    "needs a browser, so download it by hand and unzip it there), or eng-fra.txt of the "
    "PyTorch seq2seq tutorial, https://download.pytorch.org/tutorial/data.zip"
)


class TranslationPairsParams(DrawnSplitParams, TextEncodingParams):
    data_folder: str = Field(
        "~/data/translation", description="Folder holding `file`; `~` is expanded."
    )
    file: str = Field(
        "eng-fra.txt",
        description="The tab-separated pairs file in data_folder (manythings.org names them "
        "fra.txt, deu.txt, ...; the PyTorch tutorial eng-fra.txt).",
    )
    reverse: bool = Field(
        False,
        description="Translate from the second column to the first (manythings files put "
        "English first; reverse: true translates into English).",
    )
    max_length: PositiveInt | None = Field(
        None,
        description="Keep only pairs whose source and target both have at most this many "
        "tokens (words and single punctuation marks).",
    )
    source_prefixes: list[str] | None = Field(
        None,
        description="Keep only pairs whose source starts with one of these (after "
        "normalisation and `reverse`).",
    )
    target_prefixes: list[str] | None = Field(
        None,
        description="Keep only pairs whose target starts with one of these (after "
        "normalisation and `reverse`), e.g. the PyTorch tutorial's English 'i am', 'he is', ...",
    )
    lowercase: bool = Field(False, description="Lower-case both sentences.")
    normalization: Literal["none", "NFC", "NFKC", "ascii"] = Field(
        "NFC",
        description="Unicode normalisation of both sentences: NFC/NFKC, or ascii (NFD with "
        "the accents dropped, as the PyTorch tutorial does); none keeps the text as it is.",
    )
    validation_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="Share of the source sentences in validation."
    )
    test_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="Share of the source sentences in test."
    )


class TranslationPairs(DrawnSplitTask):
    """Sentence pairs for machine translation, read from a tab-separated file.

    Reads `data_folder/file` in the manythings.org format (one pair per line: source, a tab,
    target, and optionally a tab and the Tatoeba attribution, which is ignored); the same
    format as eng-fra.txt of the PyTorch seq2seq tutorial. Get the files from
    https://www.manythings.org/anki/ (the zips need a browser: download fra-eng.zip by hand
    and unzip fra.txt into data_folder).

    Both sentences are normalised (`normalization`, `lowercase`, spaces collapsed); pairs
    longer than `max_length` tokens (words and single punctuation marks) on either side, or
    whose source (target) does not start with one of `source_prefixes` (`target_prefixes`),
    are dropped. The splits are drawn by source sentence (at random with `split_seed`), so a
    sentence that the file translates several ways is in one split only, with all of its
    translations. Each split comes in a seeded order; `subset` keeps
    its first N pairs. Building reads nothing; the file is read by `prepare()`.

    Feed it to a seq2seq pipeline with one tokenizer and indexer per language: `inputs`
    -> SentenceTokenizer -> SentenceIndexer (the encoder's word indices) and `references`
    -> SentenceTokenizer -> SentenceIndexer with `add_eos: true` (the decoder's `targets`,
    which NLLLoss, AccuracyStatistics and BLEUStatistics compare its predictions with).

    Streams, per batch: `indices` (position in the split, int64), `inputs` (the source
    sentence, str), `references` (its translation, str).

    ```yaml
    training:
      task:
        type: TranslationPairs
        data_folder: ~/data/translation
        file: eng-fra.txt
        reverse: true          # French -> English
        max_length: 10
        lowercase: true
        normalization: ascii
    ```
    """

    Params = TranslationPairsParams
    params: TranslationPairsParams
    SPLIT_PARAMETERS = ("reverse", "max_length", "source_prefixes", "target_prefixes")

    def __init__(self, params: TranslationPairsParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self._sources: list[str] = []
        self._references: list[str] = []
        self._loaded = False

    # ---- streams ----------------------------------------------------------------------------
    def output_specs(self) -> dict[str, StreamSpec]:
        return {
            "indices": StreamSpec(("batch",), torch.int64, "position of each pair in the split"),
            "inputs": StreamSpec(("batch",), str, "source sentence"),
            "references": StreamSpec(
                ("batch",), str, "target sentence (the reference translation)"
            ),
        }

    # ---- reading ----------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        return Path(self.params.data_folder).expanduser() / self.params.file

    def _normalize(self, text: str) -> str:
        p = self.params
        if p.normalization == "ascii":
            decomposed = unicodedata.normalize("NFD", text)
            text = "".join(c for c in decomposed if unicodedata.category(c) != "Mn")
        elif p.normalization != "none":
            text = unicodedata.normalize(p.normalization, text)
        if p.lowercase:
            text = text.lower()
        return normalize_spaces(text)

    def _keeps(self, source: str, target: str) -> bool:
        p = self.params
        if p.max_length is not None and (
            len(WORD_PATTERN.findall(source)) > p.max_length
            or len(WORD_PATTERN.findall(target)) > p.max_length
        ):
            return False
        if p.source_prefixes is not None and not source.startswith(tuple(p.source_prefixes)):
            return False
        return p.target_prefixes is None or target.startswith(tuple(p.target_prefixes))

    def _read_pairs(self) -> list[tuple[str, str]]:
        p = self.params
        lines = read_lines(self.path, "pairs file", LAYOUT + "; get it from " + SOURCE, p.encoding)
        pairs = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) < 2 or not fields[0].strip() or not fields[1].strip():
                raise DataError.at(
                    f"{self.path}:{number}",
                    "pairs file",
                    f"line is not a tab-separated sentence pair: {line[:80]!r}; expected {LAYOUT}",
                )
            source, target = self._normalize(fields[0]), self._normalize(fields[1])
            if p.reverse:
                source, target = target, source
            if self._keeps(source, target):
                pairs.append((source, target))
        if not pairs:
            raise DataError.at(
                str(self.path),
                "pairs file",
                f"no pair is left of {len(lines)} lines after the max_length and prefix filters",
                "loosen the filters",
            )
        return pairs

    def prepare(self) -> None:
        if self._loaded:
            return
        p = self.params
        pairs = self._read_pairs()
        # Split the distinct source sentences, then take every pair of the chosen ones.
        groups: dict[str, list[int]] = {}
        for position, (source, _) in enumerate(pairs):
            groups.setdefault(dedupe_key(source), []).append(position)
        members = list(groups.values())
        chosen = split_positions(
            [0] * len(members), p.split, p.validation_fraction, p.test_fraction, p.split_seed
        )
        positions = [position for group in chosen for position in members[group]]
        if not positions:
            raise DataError.at(
                str(self.path),
                "pairs file",
                f"split '{p.split}' holds no pairs of the {len(pairs)}",
                "raise the split's fraction or use more pairs",
            )
        if p.subset is not None:
            positions = positions[: p.subset]
        self._sources = [pairs[i][0] for i in positions]
        self._references = [pairs[i][1] for i in positions]
        self._loaded = True

    # ---- samples ----------------------------------------------------------------------------
    def __len__(self) -> int:
        self.prepare()
        return len(self._sources)

    def __getitem__(self, index: int) -> Batch:
        self.prepare()
        index = self.checked_index(index, len(self._sources), "pairs")
        return {
            "indices": index,
            "inputs": self._sources[index],
            "references": self._references[index],
        }

    def collate(self, samples: list[Batch]) -> Batch:
        return collate_text_samples(samples)

    def texts(self, stream: str) -> Iterator[Any]:
        self.prepare()
        if stream == "inputs":
            yield from self._sources
        elif stream == "references":
            yield from self._references
        elif stream == "indices":
            yield from range(len(self._sources))
        else:
            raise KeyError(f"{self.label} has no stream '{stream}'")
