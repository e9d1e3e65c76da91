"""Language identification: which language a sentence is in, from WiLI-2018 or chatterbot-corpus."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, model_validator

from torchloom.core.component import BuildContext
from torchloom.data.sources import packaged_copy
from torchloom.data.text_sources import (
    dedupe_key,
    normalize_spaces,
    read_lines,
    read_text,
    split_positions,
)
from torchloom.errors import DataError
from torchloom.zoo.tasks.labelled_text import LabelledTextTask, SplitParams

LOGGER = logging.getLogger("torchloom.data")
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

WILI_FILES = ("x_train.txt", "y_train.txt", "x_test.txt", "y_test.txt")
WILI_LAYOUT = (
    "the WiLI-2018 files x_train.txt, y_train.txt, x_test.txt and y_test.txt (one paragraph, "
    "resp. one language code, per line), from https://zenodo.org/record/841984 (wili-2018.zip)"
)
CHATTERBOT_PACKAGED = ("chatterbot_corpus", "data")
CHATTERBOT_LAYOUT = (
    "one folder per language holding chatterbot-corpus YAML files "
    "(<language>/<topic>.yml with a `conversations:` list of lists of lines), as in "
    "chatterbot_corpus/data of `pip install chatterbot-corpus` or "
    "https://github.com/gunthercox/chatterbot-corpus"
)
# The chatterbot-corpus languages with at least ~200 distinct lines (several others have a
# file or two: telugu 11 lines, thai 13, urdu 18). Traditional Chinese is left out: most of
# its lines are the Chinese ones in other characters, a script question more than a language.
CHATTERBOT_LANGUAGES = (
    "bengali",
    "chinese",
    "dutch",
    "english",
    "german",
    "indonesian",
    "italian",
    "japanese",
    "korean",
    "persian",
    "portuguese",
    "spanish",
    "turkish",
    "ukrainian",
)


class LanguageIdentificationParams(SplitParams):
    format: Literal["wili", "chatterbot"] = Field(
        "chatterbot",
        description="wili: the WiLI-2018 files (x_/y_ train/test .txt); chatterbot: the "
        "chatterbot-corpus YAML files, every conversation line a sample of its folder's "
        "language (the default: installed with chatterbot-corpus, so it works offline).",
    )
    data_folder: str | None = Field(
        None,
        description="Folder of the files; default: ~/data/wili-2018 for wili, the data folder "
        "of the installed chatterbot_corpus package for chatterbot. `~` is expanded.",
    )
    languages: list[str] | None = Field(
        None,
        min_length=2,
        description="The languages (WiLI codes such as 'eng', or chatterbot folder names), in "
        "class-index order; default: every WiLI language (read from y_train.txt when the "
        "task is built), or 14 chatterbot languages with enough text.",
    )
    min_characters: int = Field(
        1, ge=1, description="Drop sentences shorter than this many characters (after stripping)."
    )
    validation_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="Share of every language in the validation split."
    )
    test_fraction: float = Field(
        0.2,
        ge=0.0,
        lt=1.0,
        description="Share of every language in the test split (chatterbot only: WiLI's test "
        "split is its x_test.txt).",
    )

    @model_validator(mode="after")
    def _wili_has_its_test_split(self) -> LanguageIdentificationParams:
        if self.format == "wili" and "test_fraction" in self.model_fields_set:
            raise ValueError("test_fraction does not apply to wili, whose test split is fixed")
        return self


class LanguageIdentification(LabelledTextTask):
    """Sentences labelled with their language: WiLI-2018, or chatterbot-corpus offline.

    `format: wili` reads WiLI-2018 (Thoma 2018; 235 languages, 500 paragraphs each in train
    and in test) from `data_folder` (default ~/data/wili-2018): x_train.txt and y_train.txt
    hold one paragraph and its language code per line, x_test.txt and y_test.txt the test
    set. Get wili-2018.zip from https://zenodo.org/record/841984 and unzip it there. The test
    split is x_test.txt; validation is drawn from every language of x_train.txt
    (`validation_fraction`, with `split_seed`).

    `format: chatterbot` (the default) reads the chatterbot-corpus YAML files
    (`<language>/<topic>.yml`); every line of every conversation becomes a sample labelled
    with its language folder. By default the data folder of the installed
    `chatterbot_corpus` package and 14 languages with at least ~200 distinct lines each
    (bengali, chinese, dutch, english, german, indonesian, italian, japanese, korean,
    persian, portuguese, spanish, turkish, ukrainian). Validation and test are drawn from
    every language apart.

    Sentences are deduplicated first (compared NFKC-normalised, case-folded, with spaces
    collapsed), so the same sentence is never in two splits; a sentence found under two
    languages is dropped as ambiguous. Each split comes in a seeded order that mixes the
    languages, and `subset` keeps its first N sentences. Building reads nothing unless the
    WiLI languages must be listed (from y_train.txt); the sentences are read by `prepare()`.

    Streams, per batch: `indices` (position in the split, int64), `inputs` (the sentence,
    str), `targets` (language index, int64), `labels` (the language, str). Publishes
    `num_classes` and `label_word_mappings`.

    ```yaml
    training:
      task: {type: LanguageIdentification, format: chatterbot, split: train}
    validation:
      task: {type: LanguageIdentification, format: chatterbot, split: validation}
    # WiLI-2018, five of its languages:
    #   task: {type: LanguageIdentification, format: wili, data_folder: ~/data/wili-2018,
    #          languages: [eng, deu, fra, nld, swe]}
    ```
    """

    Params = LanguageIdentificationParams
    params: LanguageIdentificationParams
    # Each language is split on its own: another list of languages splits the rest alike.
    SPLIT_PARAMETERS = ("min_characters",)
    TEXTS_DESCRIPTION = "sentences"

    def __init__(self, params: LanguageIdentificationParams, context: BuildContext) -> None:
        super().__init__(params, context)
        languages = params.languages
        if languages is not None and len(set(languages)) != len(languages):
            raise self._param_error("languages", f"languages are repeated: {languages}")
        if languages is None:
            languages = (
                sorted(set(self._wili_labels("train")) - {""})
                if params.format == "wili"
                else list(CHATTERBOT_LANGUAGES)
            )
        self._setup_classes(languages)

    # ---- locating ---------------------------------------------------------------------------
    def folder(self) -> Path:
        p = self.params
        if p.data_folder is not None:
            folder = Path(p.data_folder).expanduser()
        elif p.format == "wili":
            folder = Path("~/data/wili-2018").expanduser()
        else:
            packaged = packaged_copy(*CHATTERBOT_PACKAGED)
            if packaged is None:
                raise DataError.at(
                    self.where("data_folder"),
                    self.label,
                    "no data_folder is given and the chatterbot_corpus package is "
                    f"not installed; the folder should hold {CHATTERBOT_LAYOUT}",
                    "`pip install --no-deps chatterbot-corpus`, or set data_folder",
                )
            folder = packaged
        if not folder.is_dir():
            layout = WILI_LAYOUT if p.format == "wili" else CHATTERBOT_LAYOUT
            raise DataError.at(
                str(folder), "data folder", f"does not exist; it should hold {layout}"
            )
        return folder

    # ---- WiLI-2018 ----------------------------------------------------------------------------
    def _wili_file(self, name: str) -> list[str]:
        p = self.params
        return read_lines(
            self.folder() / name,
            f"WiLI-2018 file '{name}'",
            WILI_LAYOUT,
            p.encoding,
            p.fallback_encoding,
        )

    def _wili_labels(self, part: str) -> list[str]:
        return [label.strip() for label in self._wili_file(f"y_{part}.txt")]

    def _wili_pairs(self, part: str) -> list[tuple[str, str]]:
        texts = self._wili_file(f"x_{part}.txt")
        labels = self._wili_labels(part)
        if len(texts) != len(labels):
            folder = self.folder()
            raise DataError.at(
                str(folder / f"x_{part}.txt"),
                "WiLI-2018 file",
                f"has {len(texts)} lines but y_{part}.txt has {len(labels)}; "
                "they must pair line by line",
                f"get both files again; the folder should hold {WILI_LAYOUT}",
            )
        # A line with no language (a blank line, often the files' last) is no sample.
        return [(text, label) for text, label in zip(texts, labels, strict=True) if label]

    # ---- chatterbot-corpus --------------------------------------------------------------------
    def _chatterbot_pairs(self) -> list[tuple[str, str]]:
        folder = self.folder()
        pairs: list[tuple[str, str]] = []
        for language in self.class_names:
            language_folder = folder / language
            files = sorted(language_folder.glob("*.yml")) if language_folder.is_dir() else []
            if not files:
                available = sorted(
                    path.name
                    for path in folder.iterdir()
                    if path.is_dir() and any(path.glob("*.yml"))
                )
                raise DataError.at(
                    str(language_folder),
                    f"language '{language}'",
                    f"has no YAML files; expected {CHATTERBOT_LAYOUT}",
                    f"languages found there: {', '.join(available) or 'none'}",
                )
            for path in files:
                pairs += [(line, language) for line in self._conversation_lines(path)]
        return pairs

    def _conversation_lines(self, path: Path) -> list[str]:
        p = self.params
        text = read_text(
            path, "chatterbot-corpus file", CHATTERBOT_LAYOUT, p.encoding, p.fallback_encoding
        )
        try:
            # The safe loader, in C when libyaml is there: ten times faster on the corpus.
            document = yaml.load(text, Loader=SAFE_LOADER)
        except yaml.YAMLError as error:
            raise DataError.at(
                str(path), "chatterbot-corpus file", f"cannot be read: {error}"
            ) from error
        conversations = document.get("conversations") if isinstance(document, dict) else None
        if not isinstance(conversations, list):
            raise DataError.at(
                str(path),
                "chatterbot-corpus file",
                "has no `conversations:` list (a list of conversations, each a list of lines)",
            )
        lines = []
        for conversation in conversations:
            items = conversation if isinstance(conversation, list) else [conversation]
            # YAML turns unquoted `yes`/`no`/numbers into booleans and numbers, which are not
            # the line as written: only strings are kept.
            lines += [item for item in items if isinstance(item, str)]
        return lines

    # ---- splits -------------------------------------------------------------------------------
    def _unique(
        self, pairs: Iterable[tuple[str, str]], exclude: set[str] | None = None
    ) -> tuple[list[str], list[int], set[str]]:
        """Texts and targets of the pairs in the chosen languages, each sentence once (by its
        `dedupe_key`), without sentences labelled with two languages or found in `exclude`;
        also the keys of every sentence kept or dropped as ambiguous."""
        index_of = {name: index for index, name in enumerate(self.class_names)}
        minimum = self.params.min_characters
        first: dict[str, tuple[str, int]] = {}
        ambiguous: set[str] = set()
        for raw, label in pairs:
            text = normalize_spaces(raw)
            if label not in index_of or len(text) < minimum:
                continue
            key = dedupe_key(text)
            if exclude is not None and key in exclude:
                continue
            seen = first.get(key)
            if seen is None:
                first[key] = (text, index_of[label])
            elif seen[1] != index_of[label]:
                ambiguous.add(key)
        if ambiguous:
            LOGGER.info(
                "%s: dropped %d sentences found under two languages", self.label, len(ambiguous)
            )
        kept = [value for key, value in first.items() if key not in ambiguous]
        return [text for text, _ in kept], [target for _, target in kept], set(first)

    def _load(self) -> tuple[list[str], list[int]]:
        p = self.params
        split, validation_fraction, test_fraction = p.split, p.validation_fraction, 0.0
        if p.format == "chatterbot":
            texts, targets, _ = self._unique(self._chatterbot_pairs())
            test_fraction = p.test_fraction
        else:
            test_texts, test_targets, test_keys = self._unique(self._wili_pairs("test"))
            if p.split == "test":  # the whole of x_test.txt: "train" of no fractions
                texts, targets = test_texts, test_targets
                split, validation_fraction = "train", 0.0
            else:  # x_train.txt without the sentences that are also test sentences
                texts, targets, _ = self._unique(self._wili_pairs("train"), exclude=test_keys)
        missing = sorted(set(range(len(self.class_names))) - set(targets))
        if missing:
            names = [self.class_names[i] for i in missing]
            raise DataError.at(
                str(self.folder()),
                "data folder",
                f"holds no sentences of the languages {names}",
                "check the `languages` names against the data",
            )
        chosen = split_positions(targets, split, validation_fraction, test_fraction, p.split_seed)
        if not chosen:
            raise DataError.at(
                str(self.folder()),
                "data folder",
                f"split '{p.split}' holds no sentences: every language is too small "
                "for its fraction",
            )
        return [texts[i] for i in chosen], [targets[i] for i in chosen]
