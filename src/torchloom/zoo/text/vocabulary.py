"""Vocabularies: words <-> indices, with the special words `<PAD>`, `<EOS>` and `<UNK>`.

A vocabulary is a list of distinct words; a word's index is its position. The special words
a vocabulary has come first, always in the order <PAD>, <EOS>, <UNK>, so that <PAD> (when
present) is index 0, which embeddings use as their padding index. Built vocabularies list the
other words by frequency (most frequent first), ties broken alphabetically, so the same data
always gives the same vocabulary.

The file format is one word per line, in index order, UTF-8: the file a run writes into
`<run>/artifacts/<component>/vocabulary.txt` is one a later config can read back. Words
cannot hold a line break, so the three characters that would break the format are escaped:
a backslash as `\\\\`, a line feed as `\\n` and a carriage return as `\\r`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

PAD = "<PAD>"
EOS = "<EOS>"
UNK = "<UNK>"
SPECIALS = (PAD, EOS, UNK)

_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r"}
_UNESCAPES = {"\\": "\\", "n": "\n", "r": "\r"}


class VocabularyError(ValueError):
    """A vocabulary cannot be built or read; `line` is the 1-based file line, when known."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


class Vocabulary:
    """An ordered list of distinct words with the index of each.

    >>> vocabulary = Vocabulary.build([["b", "a", "b"], ["c"]], specials=(PAD, UNK))
    >>> vocabulary.words
    ('<PAD>', '<UNK>', 'b', 'a', 'c')
    >>> vocabulary.encode(["a", "zzz"])
    [3, 1]
    """

    def __init__(self, words: Sequence[str]) -> None:
        words = tuple(words)
        specials = []
        for word in words:
            if word not in SPECIALS:
                break
            specials.append(word)
        if specials != [s for s in SPECIALS if s in specials]:
            raise VocabularyError(f"special words must come first in the order {SPECIALS}")
        index: dict[str, int] = {}
        for position, word in enumerate(words):
            if not word:
                raise VocabularyError("a word is empty", position + 1)
            if word in index:
                raise VocabularyError(
                    f"'{word}' appears twice (also as entry {index[word] + 1})", position + 1
                )
            if word in SPECIALS and position >= len(specials):
                raise VocabularyError(
                    f"special word '{word}' must come before every other word", position + 1
                )
            index[word] = position
        self.words = words
        self.specials = tuple(specials)
        self._index = index
        self.pad_index = index.get(PAD)
        self.eos_index = index.get(EOS)
        self.unk_index = index.get(UNK)

    # ---- building ---------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        token_lists: Iterable[Sequence[str]],
        specials: Sequence[str] = SPECIALS,
        min_count: int = 1,
        max_size: int | None = None,
    ) -> Vocabulary:
        """The vocabulary of the words in `token_lists` (see `from_counts`)."""
        counts: Counter[str] = Counter()
        for tokens in token_lists:
            counts.update(tokens)
        return cls.from_counts(counts, specials, min_count, max_size)

    @classmethod
    def from_counts(
        cls,
        counts: Counter[str],
        specials: Sequence[str] = SPECIALS,
        min_count: int = 1,
        max_size: int | None = None,
    ) -> Vocabulary:
        """`specials` (in canonical order), then every word seen at least `min_count` times,
        most frequent first and alphabetically among equals; at most `max_size` entries in all
        (specials included). Raises `VocabularyError` when no word is left."""
        ordered_specials = [s for s in SPECIALS if s in specials]
        unknown = [s for s in specials if s not in SPECIALS]
        if unknown:
            raise VocabularyError(f"unknown special words {unknown}; known: {list(SPECIALS)}")
        if max_size is not None and max_size <= len(ordered_specials):
            raise VocabularyError(
                f"max_size {max_size} leaves no room for words after the "
                f"{len(ordered_specials)} special words"
            )
        kept = [(w, c) for w, c in counts.items() if c >= min_count and w and w not in SPECIALS]
        kept.sort(key=lambda item: (-item[1], item[0]))
        words = [w for w, _ in kept]
        if max_size is not None:
            words = words[: max_size - len(ordered_specials)]
        if not words:
            seen = sum(1 for w in counts if w and w not in SPECIALS)
            raise VocabularyError(
                f"the vocabulary is empty: {seen} distinct words seen, "
                f"none of them at least {min_count} times"
                if seen
                else "the vocabulary is empty: the texts hold no words"
            )
        return cls([*ordered_specials, *words])

    # ---- look-ups ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: object) -> bool:
        return word in self._index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.words == other.words

    def __hash__(self) -> int:
        return hash(self.words)

    def __repr__(self) -> str:
        shown = ", ".join(self.words[:6]) + (", ..." if len(self) > 6 else "")
        return f"Vocabulary({len(self)} words: {shown})"

    @property
    def word_mappings(self) -> dict[str, int]:
        """A copy of the word -> index mapping."""
        return dict(self._index)

    @property
    def regular_words(self) -> tuple[str, ...]:
        """The words that are not special."""
        return self.words[len(self.specials) :]

    def index_of(self, word: str) -> int | None:
        """The index of `word`, of <UNK> for an unknown word, or None without <UNK>."""
        return self._index.get(word, self.unk_index)

    def encode(self, tokens: Iterable[str], add_eos: bool = False) -> list[int]:
        """Indices of `tokens`; an unknown word is <UNK>, and an error without <UNK>."""
        indices = []
        for token in tokens:
            index = self._index.get(token, self.unk_index)
            if index is None:
                raise VocabularyError(f"'{token}' is not in the vocabulary, which has no {UNK}")
            indices.append(index)
        if add_eos:
            if self.eos_index is None:
                raise VocabularyError(f"cannot add {EOS}: the vocabulary has none")
            indices.append(self.eos_index)
        return indices

    def decode(self, indices: Iterable[int], stop_at_end: bool = True) -> list[str]:
        """Words of `indices`, stopping at the first <EOS> or <PAD> (neither included) when
        `stop_at_end`; an index out of range is decoded as <UNK>."""
        words = []
        for index in indices:
            if stop_at_end and index in (self.eos_index, self.pad_index):
                break
            words.append(self.words[index] if 0 <= index < len(self.words) else UNK)
        return words

    # ---- the file format --------------------------------------------------------------------
    def to_text(self) -> str:
        """One (escaped) word per line, in index order."""
        return "".join(escape_word(word) + "\n" for word in self.words)

    @classmethod
    def from_text(cls, text: str) -> Vocabulary:
        """Read what `to_text` wrote; a `VocabularyError` names the line of a malformed entry.
        A trailing carriage return (a file edited on Windows) is ignored."""
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # the final line break
        words = []
        for number, line in enumerate(lines, 1):
            line = line.removesuffix("\r")
            if not line:
                raise VocabularyError("empty line: every line must hold one word", number)
            words.append(unescape_word(line, number))
        if not any(w not in SPECIALS for w in words):
            raise VocabularyError("the vocabulary is empty: the file lists no regular word")
        return cls(words)

    def write(self, path: str | Path) -> None:
        Path(path).write_text(self.to_text(), encoding="utf-8")

    @classmethod
    def read(cls, path: str | Path) -> Vocabulary:
        """Read a vocabulary file; raises `VocabularyError` (or OSError when unreadable)."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            line = error.object[: error.start].count(b"\n") + 1
            raise VocabularyError("not valid UTF-8 text", line) from error
        return cls.from_text(text)


def escape_word(word: str) -> str:
    """`word` as one line of a vocabulary file."""
    return "".join(_ESCAPES.get(character, character) for character in word)


def unescape_word(line: str, number: int) -> str:
    """The word one line of a vocabulary file holds (`number` is the line, for errors)."""
    characters = []
    position = 0
    while position < len(line):
        character = line[position]
        if character == "\\":
            following = line[position + 1 : position + 2]
            if following not in _UNESCAPES:
                raise VocabularyError(
                    f"unknown escape '\\{following}' (write a backslash as '\\\\')", number
                )
            characters.append(_UNESCAPES[following])
            position += 2
            continue
        characters.append(character)
        position += 1
    return "".join(characters)
