"""SentenceTokenizer: words, regex, characters, character n-grams, detokenizing."""

from __future__ import annotations

import re
import time

import pydantic
import pytest

from torchloom.errors import ComponentError
from torchloom.zoo.text.tokenizer import SentenceTokenizer, TokenizationOptions, Tokenizer


def tokens(texts: list[str], **params: object) -> list[list[str]]:
    return SentenceTokenizer.create(**params)({"inputs": texts})["tokens"]


def test_whitespace_words_lowercased_by_default() -> None:
    assert tokens(["The  cat\tSAT.", ""]) == [["the", "cat", "sat."], []]
    assert tokens(["The cat"], lowercase=False) == [["The", "cat"]]


def test_punctuation_removal_deletes_unicode_punctuation_only() -> None:
    assert tokens(["Don't stop — «now», $5!"], remove_punctuation=True) == [
        ["dont", "stop", "now", "$5"]
    ]


def test_regex_splitting_separates_punctuation() -> None:
    assert tokens(["Hello, world!"], splitting="regex") == [["hello", ",", "world", "!"]]
    assert tokens(["a1 b22"], splitting="regex", token_pattern=r"[a-z]+") == [["a", "b"]]


def test_characters_collapse_white_space() -> None:
    assert tokens(["Ab \n c"], mode="characters") == [["a", "b", " ", "c"]]


def test_char_ngrams_of_space_padded_words() -> None:
    # 'ab' padded is ' ab ': bigrams ' a', 'ab', 'b '; trigrams ' ab', 'ab '; unigrams letters.
    assert tokens(["AB"], mode="char_ngrams", ngram_range=[1, 3]) == [
        ["a", "b", " a", "ab", "b ", " ab", "ab "]
    ]
    assert tokens(["ab cd"], mode="char_ngrams", ngram_range=[4, 4]) == [[" ab ", " cd "]]


def test_detokenize_joins_words_and_characters() -> None:
    detokenizer = SentenceTokenizer.create(detokenize=True)
    joined = detokenizer({"tokens": [["hello", ",", "world", "(", "x", ")", "!", "<EOS>"]]})
    assert joined == {"outputs": ["hello, world (x)!"]}
    characters = SentenceTokenizer.create(detokenize=True, mode="characters")
    assert characters({"tokens": [["a", " ", "b", "<PAD>"]]}) == {"outputs": ["a b"]}
    specs = detokenizer.input_specs()["tokens"], detokenizer.output_specs()["outputs"]
    assert [str(s) for s in specs] == ["[batch, -1] str", "[batch] str"]


def test_round_trip_of_regex_words() -> None:
    tokenizer = SentenceTokenizer.create(splitting="regex", lowercase=False)
    detokenizer = SentenceTokenizer.create(detokenize=True)
    text = "Stocks fell, then rose (slightly)."
    assert detokenizer(tokenizer({"inputs": [text]}))["outputs"] == [text]


def test_bad_options_are_errors_naming_the_key() -> None:
    with pytest.raises(ComponentError, match="detokenize"):
        SentenceTokenizer.create(detokenize=True, mode="char_ngrams")
    with pytest.raises(pydantic.ValidationError, match="ngram_range"):
        TokenizationOptions(ngram_range=(3, 2))
    with pytest.raises(pydantic.ValidationError, match="token_pattern"):
        TokenizationOptions(token_pattern="(")
    with pytest.raises(pydantic.ValidationError, match="empty string"):
        TokenizationOptions(token_pattern=r"\w*")


def test_tokenizer_is_the_shared_callable() -> None:
    options = TokenizationOptions(mode="char_ngrams", ngram_range=(2, 2))
    assert Tokenizer(options)("Hi") == [" h", "hi", "i "]


def test_a_pattern_that_backtracks_without_end_is_stopped_and_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`(a+)+$` on 30 a's and a b: Python's `re` ran for minutes (exponential in the length),
    deaf to Ctrl-C; a config or a received export's sidecar.json can hold such a pattern.
    The `regex` package ends that one at once, and stops any other at a time limit."""
    from torchloom.zoo.text import tokenizer

    monkeypatch.setattr(tokenizer, "TOKEN_PATTERN_SECONDS", 0.5)
    started = time.monotonic()
    nested = Tokenizer(TokenizationOptions(splitting="regex", token_pattern="(a+)+$"))
    assert nested("a" * 30 + "b") == [] and nested("aaa") == re.findall("(a+)+$", "aaa")
    either = Tokenizer(TokenizationOptions(splitting="regex", token_pattern="(a|aa)+$"))
    with pytest.raises(ComponentError, match=r"took more than 0.5 s on one text of 41") as err:
        either("a" * 40 + "b")
    assert time.monotonic() - started < 5
    assert "repeat inside a repeat" in str(err.value)
    # The same tokens as `re` cuts, for the default pattern and the usual word pattern.
    text = "Don't stop — «now», it's 5.5% (of 12)!"
    for pattern in (r"\w+|[^\w\s]", r"(?u)\b\w\w+\b", r"\w+(?:'\w+)*"):
        options = TokenizationOptions(splitting="regex", token_pattern=pattern)
        assert Tokenizer(options)(text) == re.findall(pattern, text.lower())
