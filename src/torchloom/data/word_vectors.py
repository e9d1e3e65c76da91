"""Pretrained word vectors in the GloVe and word2vec text formats.

GloVe files hold one word and its values per line, separated by single spaces; word2vec text
files are the same after a header line "<number of vectors> <dimension>". Either may be a
plain `.txt`, a gzipped `.txt.gz`, or a member of a `.zip` archive such as the published
`glove.6B.zip`. Files are streamed line by line and only the vectors of the words asked for
are kept, so reading a 400,000-word file for a 20,000-word vocabulary needs memory for
20,000 vectors. Malformed lines are `DataError`s that name the file and line.
"""

from __future__ import annotations

import gzip
import zipfile
from array import array
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, cast

from torchloom.data.sources import ensure_files
from torchloom.errors import DataError, Problem


@dataclass(frozen=True)
class VectorsDownload:
    """A published word-vector archive: where to get it and its md5."""

    file_name: str
    mirrors: tuple[str, ...]  # base URLs; the file's URL is a mirror followed by its name
    md5: str
    members: tuple[str, ...]  # the vector files inside the archive
    homepage: str


# GloVe 6B (Wikipedia 2014 + Gigaword 5, 400,000 lower-cased words; Pennington et al. 2014):
# 822 MB, four files of 50, 100, 200 and 300 dimensions. The md5 is of the archive as
# https://nlp.stanford.edu/data/glove.6B.zip serves it.
GLOVE_6B = VectorsDownload(
    file_name="glove.6B.zip",
    mirrors=("https://nlp.stanford.edu/data/", "https://downloads.cs.stanford.edu/nlp/data/"),
    md5="056ea991adb4740ac6bf1b6d9b50408b",
    members=tuple(f"glove.6B.{d}d.txt" for d in (50, 100, 200, 300)),
    homepage="https://nlp.stanford.edu/projects/glove/",
)
KNOWN_DOWNLOADS = {GLOVE_6B.file_name: GLOVE_6B}


def fetch_vectors(path: str | Path, allow_download: bool, md5: str | None = None) -> Path:
    """`path` once it holds the verified archive it names (e.g. `~/data/glove/glove.6B.zip`),
    downloaded into its folder when missing and `allow_download`; `md5` overrides the known
    checksum (a re-published archive). A `DataError` when it cannot be had."""
    path = Path(path).expanduser()
    source = KNOWN_DOWNLOADS.get(path.name)
    if source is None:
        known = ", ".join(KNOWN_DOWNLOADS)
        raise DataError.at(str(path), "word vectors", f"no known download (known: {known})")
    folder = ensure_files(
        path.parent,
        {path.name: md5 or source.md5},
        packaged=[],
        mirrors=source.mirrors,
        allow_download=allow_download,
        layout_hint=f"{source.file_name} from {source.homepage}",
    )
    return folder / path.name


@dataclass
class WordVectors:
    """The vectors read from one file: those of the words asked for, by word."""

    source: str  # the file (and archive member) they were read from, for messages
    dimension: int
    # float32 arrays: a quarter of the memory of lists of Python floats
    vectors: dict[str, array[float]] = field(default_factory=dict)
    words_in_file: int = 0


def _member(archive: zipfile.ZipFile, path: Path, member: str | None, dimension: int | None) -> str:
    names = [n for n in archive.namelist() if not n.endswith("/")]
    if member is not None:
        if member in names:
            return member
        problem = f"has no member '{member}'; it holds {', '.join(names) or 'nothing'}"
        raise DataError.at(str(path), "word-vector archive", problem)
    texts = [n for n in names if n.endswith((".txt", ".vec"))] or names
    if len(texts) > 1 and dimension is not None:
        # glove.6B.zip holds glove.6B.50d.txt ... glove.6B.300d.txt: pick by the dimension.
        texts = [n for n in texts if f".{dimension}d." in n] or texts
    if len(texts) == 1:
        return texts[0]
    raise DataError.at(
        str(path),
        "word-vector archive",
        f"holds several files ({', '.join(texts) or 'none'}): say which to read",
        "name the member (SentenceEmbeddings: `pretrained_member`)",
    )


@contextmanager
def open_vector_lines(
    path: str | Path, member: str | None = None, dimension: int | None = None
) -> Iterator[tuple[str, IO[bytes]]]:
    """(display name, binary line stream) of a .txt, .txt.gz or a member of a .zip file."""
    path = Path(path).expanduser()
    try:
        if path.suffix == ".zip":
            with zipfile.ZipFile(path) as archive:
                name = _member(archive, path, member, dimension)
                with archive.open(name) as handle:
                    yield f"{path}:{name}", handle
        elif path.suffix == ".gz":
            with gzip.open(path, "rb") as zipped:
                yield str(path), cast(IO[bytes], zipped)
        else:
            with open(path, "rb") as handle:
                yield str(path), handle
    except (OSError, zipfile.BadZipFile, EOFError) as error:  # gzip: OSError / EOFError
        problem = f"cannot be read: {error}"
        raise DataError.at(str(path), "word-vector file", problem) from error


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _header(parts: list[str]) -> tuple[int, int] | None:
    """(count, dimension) when a first line is a word2vec header."""
    if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
        return int(parts[0]), int(parts[1])
    return None


def _lines(source: str, handle: IO[bytes]) -> Iterator[tuple[int, str]]:
    """(line number, line without trailing white space) of every non-empty line."""
    for number, raw in enumerate(handle, 1):
        try:
            line = raw.decode("utf-8").rstrip()
        except UnicodeDecodeError as error:
            problem = f"is not UTF-8 text ({error.reason} at byte {error.start})"
            raise DataError.at(f"{source}:{number}", "word-vector line", problem) from error
        if line:
            yield number, line


def vectors_dimension(
    path: str | Path, member: str | None = None, expected: int | None = None
) -> int:
    """The dimension of a vector file, read from its first line (or word2vec header);
    `expected` only helps pick the member of an archive such as glove.6B.zip."""
    with open_vector_lines(path, member, expected) as (source, handle):
        for _, line in _lines(source, handle):
            header = _header(line.split(" "))
            return header[1] if header else line.count(" ")
    raise DataError.at(source, "word-vector file", "is empty")


def read_word_vectors(
    path: str | Path,
    wanted: Collection[str] | None = None,
    dimension: int | None = None,
    member: str | None = None,
) -> WordVectors:
    """The vectors of the words in `wanted` (every word when None) from a GloVe or word2vec
    text file. `dimension`: the one expected (a line with another number of values is an
    error naming it); None takes the file's. A word seen twice keeps its first vector."""
    with open_vector_lines(path, member, dimension) as (source, handle):
        result = WordVectors(source, dimension or 0)
        declared: int | None = None
        last = 0
        for number, line in _lines(source, handle):
            last = number
            if number == 1 and (header := _header(line.split(" "))) is not None:
                declared, size = header
                if dimension is not None and size != dimension:
                    message = f"header says {size} dimensions, expected {dimension}"
                    raise _line_error(source, number, message)
                result.dimension = size
                continue
            if result.dimension == 0:
                result.dimension = line.count(" ")
                if result.dimension < 1:
                    raise _line_error(source, number, "a word without values")
            # Most lines are a word and `dimension` values: counting spaces checks that
            # without splitting the lines of the many words that are not wanted.
            if line.count(" ") == result.dimension:
                word, _, rest = line.partition(" ")
                values = None
            else:
                word, values = _split(source, number, line.split(" "), result.dimension)
            result.words_in_file += 1
            if (wanted is None or word in wanted) and word not in result.vectors:
                try:
                    result.vectors[word] = array("f", map(float, values or rest.split(" ")))
                except ValueError as error:
                    message = f"a value is not a number ({error})"
                    raise _line_error(source, number, message) from error
        if declared is not None and declared != result.words_in_file:
            raise _line_error(
                source,
                last,
                f"the header announces {declared} vectors but the file holds "
                f"{result.words_in_file} (a truncated file?)",
            )
        if result.words_in_file == 0:
            raise DataError.at(source, "word-vector file", "holds no vectors")
    return result


def _split(source: str, number: int, parts: list[str], dimension: int) -> tuple[str, list[str]]:
    if len(parts) == dimension + 1:
        return parts[0], parts[1:]
    # Some GloVe files (840B) have words with spaces in them ('. . .'): the fields before
    # the last `dimension` values are then not all numbers. Extra numbers are a wrong size.
    if len(parts) > dimension + 1 and not all(_is_number(p) for p in parts[1:-dimension]):
        return " ".join(parts[:-dimension]), parts[-dimension:]
    raise _line_error(source, number, f"{len(parts) - 1} values, expected {dimension}")


def _line_error(source: str, number: int, message: str) -> DataError:
    return DataError([Problem(f"{source}:{number}", "word-vector line", message)])
