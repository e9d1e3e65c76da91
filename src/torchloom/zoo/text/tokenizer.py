"""Sentences -> tokens (words, characters or character n-grams), and tokens -> sentences.

`TokenizationOptions` is one parameter model shared by `SentenceTokenizer` and
`SentenceIndexer` (which tokenizes the training texts when it builds its vocabulary from
them), so that both cut a text the same way when they are given the same options.
"""

from __future__ import annotations

import functools
import sys
import unicodedata
from collections.abc import Sequence
from typing import Literal

import regex
from pydantic import Field, field_validator

from torchloom.core.component import Batch, BuildContext, Component, ComponentParams
from torchloom.core.streams import StreamSpec
from torchloom.errors import ComponentError
from torchloom.zoo.text.vocabulary import EOS, PAD

# Tokens that attach to the word before them / after them when words are joined back.
_NO_SPACE_BEFORE = set(".,;:!?%)]}")
_NO_SPACE_AFTER = set("([{")
# The most a token_pattern may take on one text. A pattern of nested repeats (`(a+)+$`) takes
# time exponential in a text's length on some texts, and a config or a received export's
# sidecar.json is untrusted: Python's own `re` cannot be stopped, the `regex` package's
# matching can.
TOKEN_PATTERN_SECONDS = 2.0


class TokenizationOptions(ComponentParams):
    """How a text is cut into tokens (shared by the tokenizer and the indexer)."""

    mode: Literal["words", "characters", "char_ngrams"] = Field(
        "words",
        description="words: the text's words; characters: every character (runs of white "
        "space become one space); char_ngrams: the character n-grams of every word padded "
        "with a space on each side ('the' -> ' t', 'th', 'he', 'e ', ' th', ...; unigrams "
        "are the letters alone), the usual features for language identification.",
    )
    splitting: Literal["whitespace", "regex"] = Field(
        "whitespace",
        description="How words are found (modes words and char_ngrams): split at white space, "
        "or every match of `token_pattern`.",
    )
    token_pattern: str = Field(
        r"\w+|[^\w\s]",
        description="Regular expression of one token, for `splitting: regex`; the default "
        "makes words and separate punctuation marks.",
    )
    lowercase: bool = Field(True, description="Lower-case the text first.")
    remove_punctuation: bool = Field(
        False,
        description="Delete every Unicode punctuation character (category P*) first: "
        "\"don't stop.\" -> 'dont stop'.",
    )
    ngram_range: tuple[int, int] = Field(
        (1, 3),
        description="Smallest and largest n of the character n-grams (mode char_ngrams).",
    )

    @field_validator("token_pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            compiled = regex.compile(pattern)
        except regex.error as error:
            raise ValueError(f"not a valid regular expression: {error}") from error
        if compiled.match(""):
            raise ValueError("the pattern matches the empty string, so tokens could be empty")
        return pattern

    @field_validator("ngram_range")
    @classmethod
    def _ordered(cls, value: tuple[int, int]) -> tuple[int, int]:
        smallest, largest = value
        if not 1 <= smallest <= largest <= 20:
            raise ValueError(f"{list(value)}: need 1 <= min <= max <= 20")
        return value


@functools.cache
def _punctuation_table() -> dict[int, None]:
    # Built once, on first use (~0.2 s): str.translate with a table is far faster per text
    # than testing each character's Unicode category.
    return {
        code: None
        for code in range(sys.maxunicode + 1)
        if unicodedata.category(chr(code)).startswith("P")
    }


class Tokenizer:
    """A callable text -> tokens for one set of `TokenizationOptions`."""

    def __init__(self, options: TokenizationOptions) -> None:
        self.options = options
        self._pattern = regex.compile(options.token_pattern)

    def normalize(self, text: str) -> str:
        if self.options.lowercase:
            text = text.lower()
        if self.options.remove_punctuation:
            text = text.translate(_punctuation_table())
        return text

    def words(self, text: str) -> list[str]:
        text = self.normalize(text)
        if self.options.splitting == "regex":
            try:
                return list(self._pattern.findall(text, timeout=TOKEN_PATTERN_SECONDS))
            except TimeoutError:
                raise ComponentError.at(
                    "",
                    f"token_pattern {self.options.token_pattern!r}",
                    f"took more than {TOKEN_PATTERN_SECONDS:g} s on one text of {len(text)} "
                    "characters: it backtracks without end (nested repeats, as in (a+)+)",
                    "write it without a repeat inside a repeat, e.g. \\w+ for (\\w+)+",
                ) from None
        return text.split()

    def __call__(self, text: str) -> list[str]:
        mode = self.options.mode
        if mode == "words":
            return self.words(text)
        if mode == "characters":
            return list(" ".join(self.normalize(text).split()))
        smallest, largest = self.options.ngram_range
        ngrams = []
        for word in self.words(text):
            padded = f" {word} "
            for n in range(smallest, largest + 1):
                if n == 1:  # a lone boundary space says nothing: unigrams are the letters
                    ngrams += list(word)
                else:
                    ngrams += [padded[i : i + n] for i in range(len(padded) - n + 1)]
        return ngrams


def join_tokens(tokens: Sequence[str], mode: str) -> str:
    """Tokens back to a text: characters are concatenated; words are joined by spaces, except
    before closing punctuation and after opening brackets. <PAD> and <EOS> are dropped."""
    kept = [t for t in tokens if t not in (PAD, EOS)]
    if mode == "characters":
        return "".join(kept)
    pieces: list[str] = []
    previous = ""
    for token in kept:
        attach = set(token) <= _NO_SPACE_BEFORE or set(previous) <= _NO_SPACE_AFTER
        pieces.append(token if attach or not pieces else " " + token)
        previous = token
    return "".join(pieces)


class SentenceTokenizerParams(TokenizationOptions):
    detokenize: bool = Field(
        False,
        description="Reverse direction: join the `tokens` stream back into texts (`outputs`); "
        "not possible for mode char_ngrams.",
    )


class SentenceTokenizer(Component):
    """Cuts texts into tokens: words (split at white space or by a regular expression),
    characters, or character n-grams of every word; optionally lower-cased and without
    punctuation. With `detokenize: true` it goes the other way and joins tokens into texts.

    Streams: `inputs` (one text per sample) -> `tokens` (a list of tokens per sample);
    detokenize: `tokens` -> `outputs` (one text per sample). Give a `SentenceIndexer` that
    builds its vocabulary from the raw training texts the same tokenization options.

    ```yaml
    pipeline:
      tokenizer: {type: SentenceTokenizer, remove_punctuation: true}
      # or character trigrams to quadgrams, for language identification:
      # tokenizer: {type: SentenceTokenizer, mode: char_ngrams, ngram_range: [3, 4]}
      # and back from tokens to text:
      # detokenizer:
      #   {type: SentenceTokenizer, detokenize: true, streams: {tokens: predicted_tokens}}
    ```
    """

    Params = SentenceTokenizerParams
    params: SentenceTokenizerParams

    def __init__(self, params: SentenceTokenizerParams, context: BuildContext) -> None:
        super().__init__(params, context)
        if params.detokenize and params.mode == "char_ngrams":
            raise ComponentError.at(
                self.where("detokenize"),
                self.label,
                "character n-grams overlap, so they cannot be joined back into a text",
                "use mode words or characters to detokenize",
            )
        self.tokenizer = Tokenizer(params)

    def input_specs(self) -> dict[str, StreamSpec]:
        if self.params.detokenize:
            return {"tokens": StreamSpec(("batch", -1), str, "tokens of each sample")}
        return {"inputs": StreamSpec(("batch",), str, "text of each sample")}

    def output_specs(self) -> dict[str, StreamSpec]:
        if self.params.detokenize:
            return {"outputs": StreamSpec(("batch",), str, "text of each sample")}
        return {"tokens": StreamSpec(("batch", -1), str, f"{self.params.mode} of each sample")}

    def forward(self, inputs: Batch) -> Batch:
        if self.params.detokenize:
            return {"outputs": [join_tokens(t, self.params.mode) for t in inputs["tokens"]]}
        return {"tokens": [self.tokenizer(text) for text in inputs["inputs"]]}
