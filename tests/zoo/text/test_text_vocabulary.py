"""Vocabulary: deterministic building, encoding, decoding and the file format."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from torchloom.zoo.text.vocabulary import EOS, PAD, UNK, Vocabulary, VocabularyError


def test_build_orders_by_frequency_then_alphabet() -> None:
    vocabulary = Vocabulary.build([["b", "c", "a"], ["c", "b", "d"], ["c"]])
    assert vocabulary.words == (PAD, EOS, UNK, "c", "b", "a", "d")
    assert vocabulary.pad_index == 0 and vocabulary.eos_index == 1 and vocabulary.unk_index == 2
    # The same words in another order give the same vocabulary.
    assert Vocabulary.build([["c"], ["d", "b", "c"], ["a", "c", "b"]]) == vocabulary


def test_min_count_max_size_and_specials() -> None:
    counts = Counter({"x": 3, "y": 2, "z": 1, "w": 2})
    vocabulary = Vocabulary.from_counts(counts, specials=(UNK, PAD), min_count=2, max_size=4)
    # Specials in canonical order (PAD first), max_size counts them.
    assert vocabulary.words == (PAD, UNK, "x", "w")
    assert Vocabulary.from_counts(counts, specials=()).words == ("x", "w", "y", "z")


def test_empty_vocabulary_is_an_error() -> None:
    with pytest.raises(VocabularyError, match="empty: 2 distinct words seen, none of them at"):
        Vocabulary.build([["a", "b"]], min_count=2)
    with pytest.raises(VocabularyError, match="hold no words"):
        Vocabulary.build([[], []])
    with pytest.raises(VocabularyError, match="leaves no room"):
        Vocabulary.build([["a"]], max_size=3)


def test_encode_and_decode() -> None:
    vocabulary = Vocabulary([PAD, EOS, UNK, "cat", "sat"])
    assert vocabulary.encode(["cat", "dog", "sat"], add_eos=True) == [3, 2, 4, 1]
    assert vocabulary.decode([3, 4, 1, 3]) == ["cat", "sat"]
    assert vocabulary.decode([3, 0, 4]) == ["cat"]
    assert vocabulary.decode([3, 1, 99], stop_at_end=False) == ["cat", EOS, UNK]
    strict = Vocabulary([PAD, "cat"])
    with pytest.raises(VocabularyError, match="'dog' is not in the vocabulary"):
        strict.encode(["dog"])
    with pytest.raises(VocabularyError, match="cannot add <EOS>"):
        strict.encode(["cat"], add_eos=True)


def test_file_format_round_trips_awkward_words(tmp_path: Path) -> None:
    vocabulary = Vocabulary([PAD, UNK, "é", " ", "a\\b", "line\nbreak", "cr\r", "#x"])
    path = tmp_path / "vocabulary.txt"
    vocabulary.write(path)
    assert Vocabulary.read(path) == vocabulary
    assert path.read_text(encoding="utf-8").splitlines()[4:6] == ["a\\\\b", "line\\nbreak"]
    # A file edited on Windows reads the same.
    windows = tmp_path / "windows.txt"
    windows.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    assert Vocabulary.read(windows) == vocabulary


@pytest.mark.parametrize(
    ("text", "message", "line"),
    [
        ("<PAD>\ncat\n\ndog\n", "empty line", 3),
        ("<PAD>\ncat\ndog\ncat\n", "'cat' appears twice", 4),
        ("<PAD>\ncat\n<UNK>\n", "special word '<UNK>' must come before", 3),
        ("<PAD>\nbad\\q\n", "unknown escape", 2),
        ("<PAD>\n<UNK>\n", "lists no regular word", None),
    ],
)
def test_malformed_files_name_the_line(text: str, message: str, line: int | None) -> None:
    with pytest.raises(VocabularyError, match=message) as caught:
        Vocabulary.from_text(text)
    assert caught.value.line == line


def test_specials_out_of_order_and_bad_utf8(tmp_path: Path) -> None:
    with pytest.raises(VocabularyError, match="special words must come first"):
        Vocabulary([UNK, PAD, "a"])
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"<PAD>\ncaf\xe9\n")
    with pytest.raises(VocabularyError, match="UTF-8") as caught:
        Vocabulary.read(path)
    assert caught.value.line == 2
