"""Reading GloVe / word2vec text files (plain, gzipped, zipped) and the GloVe download."""

from __future__ import annotations

import gzip
import zipfile
from pathlib import Path

import pytest

from torchloom.data.sources import md5_of
from torchloom.data.word_vectors import (
    GLOVE_6B,
    fetch_vectors,
    read_word_vectors,
    vectors_dimension,
)
from torchloom.errors import DataError

GLOVE = "the 0.1 0.2 0.3\ncat -1 2.5 3e-1\ndog 4 5 6\n"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_reads_glove_keeping_only_wanted_words(tmp_path: Path) -> None:
    path = write(tmp_path / "vectors.txt", GLOVE)
    vectors = read_word_vectors(path, {"cat", "dog", "zebra"})
    assert vectors.dimension == 3 and vectors.words_in_file == 3
    assert {w: list(v) for w, v in vectors.vectors.items()} == {
        "cat": pytest.approx([-1.0, 2.5, 0.3]),
        "dog": [4.0, 5.0, 6.0],
    }
    assert vectors.vectors["cat"].typecode == "f"  # float32: memory stays small
    assert read_word_vectors(path).vectors.keys() == {"the", "cat", "dog"}
    assert vectors_dimension(path) == 3


def test_word2vec_header_gzip_and_trailing_spaces(tmp_path: Path) -> None:
    path = tmp_path / "vectors.txt.gz"
    with gzip.open(path, "wt", encoding="utf-8") as file:
        file.write("2 3\nthe 0.1 0.2 0.3 \ncat 1 2 3 \n")
    assert vectors_dimension(path) == 3
    vectors = read_word_vectors(path, {"cat"}, dimension=3)
    assert list(vectors.vectors["cat"]) == [1.0, 2.0, 3.0] and vectors.words_in_file == 2
    assert vectors.vectors.keys() == {"cat"}


def test_zip_member_by_name_or_by_dimension(tmp_path: Path) -> None:
    path = tmp_path / "glove.6B.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("glove.6B.3d.txt", GLOVE)
        archive.writestr("glove.6B.2d.txt", "cat 7 8\n")
    assert list(read_word_vectors(path, {"cat"}, 2).vectors["cat"]) == [7.0, 8.0]
    assert read_word_vectors(path, member="glove.6B.3d.txt").source.endswith(":glove.6B.3d.txt")
    with pytest.raises(DataError, match="holds several files"):
        read_word_vectors(path)
    with pytest.raises(DataError, match=r"has no member 'x\.txt'; it holds glove\.6B\.3d\.txt"):
        read_word_vectors(path, member="x.txt")


def test_words_with_spaces_as_in_glove_840b(tmp_path: Path) -> None:
    path = write(tmp_path / "v.txt", "a 1 2\n. . . 3 4\n")
    assert list(read_word_vectors(path).vectors[". . ."]) == [3.0, 4.0]


@pytest.mark.parametrize(
    ("text", "dimension", "where", "message"),
    [
        ("the 1 2 3\ncat 1 2\n", None, ":2", "2 values, expected 3"),
        ("the 1 2 3\ncat 1 2 3 4\n", None, ":2", "4 values, expected 3"),
        ("the 1 2 3\n", 4, ":1", "3 values, expected 4"),
        ("the 1 x 3\n", None, ":1", "a value is not a number"),
        ("3 2\na 1 2\nb 3 4\n", None, ":3", "announces 3 vectors but the file holds 2"),
        ("2 5\na 1 2\n", 2, ":1", "header says 5 dimensions, expected 2"),
        ("the\n", None, ":1", "a word without values"),
    ],
)
def test_malformed_lines_are_named(
    tmp_path: Path, text: str, dimension: int | None, where: str, message: str
) -> None:
    path = write(tmp_path / "v.txt", text)
    with pytest.raises(DataError, match=message) as caught:
        read_word_vectors(path, dimension=dimension)
    assert caught.value.problems[0].where == f"{path}{where}"


def test_unreadable_files(tmp_path: Path) -> None:
    (tmp_path / "bad.txt").write_bytes(b"a 1\ncaf\xe9 2\n")
    with pytest.raises(DataError, match="not UTF-8") as caught:
        read_word_vectors(tmp_path / "bad.txt")
    assert caught.value.problems[0].where.endswith("bad.txt:2")
    with pytest.raises(DataError, match="is empty"):
        vectors_dimension(write(tmp_path / "empty.txt", "\n"))
    with pytest.raises(DataError, match="cannot be read"):
        read_word_vectors(write(tmp_path / "fake.zip", "not a zip"))
    with pytest.raises(DataError, match="cannot be read"):
        read_word_vectors(tmp_path / "missing.txt")
    truncated = tmp_path / "truncated.txt.gz"
    archive = gzip.compress("".join(f"w{i} 1 2\n" for i in range(5000)).encode())
    truncated.write_bytes(archive[: len(archive) // 2])
    with pytest.raises(DataError, match="cannot be read: Compressed file ended"):
        read_word_vectors(truncated)


def test_glove_download_description_and_checksums(tmp_path: Path) -> None:
    assert GLOVE_6B.mirrors[0] + GLOVE_6B.file_name == "https://nlp.stanford.edu/data/glove.6B.zip"
    assert GLOVE_6B.md5 == "056ea991adb4740ac6bf1b6d9b50408b"
    assert "glove.6B.300d.txt" in GLOVE_6B.members
    # Offline and not allowed to download: the error says where to get it.
    with pytest.raises(DataError, match=r"nlp\.stanford\.edu/projects/glove"):
        fetch_vectors(tmp_path / "glove" / "glove.6B.zip", allow_download=False)
    # A file already there is checked against the md5, which can be overridden.
    local = tmp_path / "glove.6B.zip"
    local.write_bytes(b"a re-published archive")
    with pytest.raises(DataError, match=f"expected {GLOVE_6B.md5}"):
        fetch_vectors(local, allow_download=False)
    assert fetch_vectors(local, allow_download=False, md5=md5_of(local)) == local
    with pytest.raises(DataError, match="no known download"):
        fetch_vectors(tmp_path / "vectors.txt", allow_download=False)
