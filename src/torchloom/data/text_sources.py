"""Reading text datasets: decoding files, delimited files, seeded splits, packaged copies.

What the text tasks (`TextClassification`, `LanguageIdentification`, `LanguageModeling`,
`TranslationPairs`) share:

- `read_text` / `read_lines` decode a file strictly (UTF-8 by default), optionally falling
  back to a second encoding per file, and name the file when it cannot be decoded;
- `read_delimited` reads a CSV/TSV file with Python's `csv` module, `pick_columns` the
  columns a task needs from its rows;
- `split_positions` draws reproducible train/validation/test splits from a seed, class by
  class (stratified) when classes are given;
- `dedupe_key` is the key under which two sentences count as the same one;
- `locate_folder` finds the data folder, or an installed packaged copy when it is missing;
- `collate_text_samples` batches samples whose values are ints, floats, tensors, strings or
  lists of strings (strings and lists stay lists).

Every problem with a file is a `DataError` naming the file, so the CLI prints it and exits 2.
"""

from __future__ import annotations

import codecs
import csv
import io
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from torchloom.data.sources import packaged_copy
from torchloom.errors import DataError

SplitName = Literal["train", "validation", "test"]


def check_encoding(name: str) -> str:
    """`name` if Python knows the codec (for parameter validators), else a ValueError."""
    try:
        codecs.lookup(name)
    except LookupError as error:
        raise ValueError(f"unknown text encoding '{name}'") from error
    return name


def decode(data: bytes, path: Path, encoding: str, fallback_encoding: str | None = None) -> str:
    """The text of a file's bytes, decoded strictly with `encoding`, else `fallback_encoding`.

    A file that neither decodes is a `DataError` naming the file and the first bad byte.
    """
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as error:
        if fallback_encoding is not None:
            try:
                return data.decode(fallback_encoding)
            except UnicodeDecodeError:
                pass
        bad = data[error.start : error.start + 1].hex()
        tried = encoding + (f" nor {fallback_encoding}" if fallback_encoding else "")
        suggestion = (
            "convert the file, or set the task's `encoding` to the file's encoding"
            if fallback_encoding
            else "convert the file, or set the task's `fallback_encoding` (e.g. latin-1) "
            "or `encoding` to the file's encoding"
        )
        raise DataError.at(
            str(path),
            f"file '{path.name}'",
            f"is not valid {tried} text (byte 0x{bad} at offset {error.start})",
            suggestion,
        ) from error


def read_bytes(path: Path, what: str, layout: str) -> bytes:
    """A file's bytes, or a `DataError` saying what it should be (`layout`) when missing."""
    try:
        return path.read_bytes()
    except FileNotFoundError as error:
        raise DataError.at(str(path), what, f"is missing; expected {layout}") from error
    except OSError as error:  # a folder in its place, no permission
        raise DataError.at(str(path), what, f"cannot be read: {error}") from error


def read_text(
    path: Path,
    what: str,
    layout: str,
    encoding: str = "utf-8",
    fallback_encoding: str | None = None,
) -> str:
    """The decoded text of a file (see `decode`); `what`/`layout` word the missing-file error.

    A leading byte-order mark is dropped (Windows editors write one)."""
    text = decode(read_bytes(path, what, layout), path, encoding, fallback_encoding)
    return text.removeprefix("\ufeff")


def read_lines(
    path: Path,
    what: str,
    layout: str,
    encoding: str = "utf-8",
    fallback_encoding: str | None = None,
) -> list[str]:
    """The lines of a text file, without their line ends.

    Split on '\\n' only (a '\\r' before it is dropped): `str.splitlines` also splits on
    U+2028, U+0085 and form feeds, which occur inside the sentences of real corpora (WiLI,
    Wikipedia) and would shift every line after them against a parallel labels file.
    """
    text = read_text(path, what, layout, encoding, fallback_encoding)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line starts no new one
    return [line.removesuffix("\r") for line in lines]


def read_delimited(
    path: Path,
    delimiter: str,
    what: str,
    layout: str,
    encoding: str = "utf-8",
    fallback_encoding: str | None = None,
) -> list[list[str]]:
    """The rows of a CSV/TSV file (quoted fields may hold delimiters and newlines)."""
    text = read_text(path, what, layout, encoding, fallback_encoding)
    # newline="" splits rows on \n, \r and \r\n only, as the csv module expects.
    lines = io.StringIO(text, newline="")
    try:
        if delimiter == "\t":  # TSV files do not quote: a lone quote is part of the text
            return list(csv.reader(lines, delimiter=delimiter, quoting=csv.QUOTE_NONE))
        return list(csv.reader(lines, delimiter=delimiter))
    except csv.Error as error:
        raise DataError.at(str(path), what, f"is not a valid delimited file: {error}") from error


def pick_columns(
    rows: list[list[str]], columns: dict[str, str | int], header: bool, path: Path
) -> list[tuple[str, ...]]:
    """The given columns (by header name or 0-based index; keyed by the parameter that names
    them, for the errors) of every non-blank data row, stripped."""
    names = rows[0] if header and rows else []
    positions = []
    for key, column in columns.items():
        if isinstance(column, int):
            positions.append(column)
        elif column in names:
            positions.append(names.index(column))
        else:
            raise DataError.at(
                str(path),
                "data file",
                f"has no column '{column}' (the {key}); its header is {names}",
                f"set the task's {key} to one of them",
            )
    needed = max(positions)
    picked = []
    for number, row in enumerate(rows[1:] if header else rows, 2 if header else 1):
        if not any(field.strip() for field in row):
            continue  # blank lines, often at the end of hand-written files
        if needed >= len(row):
            raise DataError.at(
                f"{path}:{number}",
                "data file",
                f"row has {len(row)} fields, needs column {needed} (0-based) for "
                f"the {' and '.join(columns)}",
                "check the delimiter and the column indices",
            )
        values = tuple(row[position].strip() for position in positions)
        empty = [key for key, value in zip(columns, values, strict=True) if not value]
        if empty:  # an empty label would be a class of its own, shifting every other index
            raise DataError.at(
                f"{path}:{number}",
                "data file",
                f"row has an empty {' and '.join(empty)}",
                "fill it in, or remove the row",
            )
        picked.append(values)
    if not picked:
        raise DataError.at(str(path), "data file", "has no data rows")
    return picked


def normalize_spaces(text: str) -> str:
    """The text with every run of white space (newlines included) made one space, stripped."""
    return " ".join(text.split())


def dedupe_key(text: str) -> str:
    """The key under which two sentences are the same one: NFKC form, case-folded, spaces
    collapsed. Near-copies ("Hello!" / "hello! ") then never end in two different splits."""
    return normalize_spaces(unicodedata.normalize("NFKC", text)).casefold()


def distinct_positions(texts: Sequence[str], classes: Sequence[int] | None = None) -> list[int]:
    """Positions of the texts worth splitting: the first copy of each text (`dedupe_key`), so
    that no copy of a training text is validated or tested on, and none of a text found
    under two classes (its label cannot be known)."""
    first: dict[str, int] = {}
    labels: dict[str, set[int]] = {}
    for position, text in enumerate(texts):
        key = dedupe_key(text)
        first.setdefault(key, position)
        labels.setdefault(key, set()).add(classes[position] if classes is not None else 0)
    return sorted(position for key, position in first.items() if len(labels[key]) == 1)


def locate_folder(
    data_folder: str | Path,
    packaged: tuple[str, str] | None,
    allow_packaged: bool,
) -> Path | None:
    """`data_folder` (with `~` expanded) if it exists, else the packaged copy
    (pip package, folder inside it) when allowed and installed, else None."""
    folder = Path(data_folder).expanduser()
    if folder.exists():
        return folder
    if allow_packaged and packaged is not None:
        return packaged_copy(*packaged)
    return None


def split_positions(
    classes: Sequence[int],
    split: SplitName,
    validation_fraction: float,
    test_fraction: float,
    seed: int,
) -> list[int]:
    """Positions of the items of one split, in a seeded order that mixes the classes.

    Every class (one per distinct value of `classes`; give all zeros for an unstratified
    split) is drawn on its own with the same seed: its first `test_fraction` (rounded) go to
    test, the next `validation_fraction` to validation, the rest to train. So the three
    splits never overlap, keep the class proportions, and adding items to one class does not
    move another's between splits.
    """
    members: dict[int, list[int]] = {}
    for position, value in enumerate(classes):
        members.setdefault(value, []).append(position)
    chosen: list[int] = []
    for value in sorted(members):
        items = members[value]
        order = torch.randperm(len(items), generator=torch.Generator().manual_seed(seed))
        test_count = round(len(items) * test_fraction)
        validation_count = round(len(items) * validation_fraction)
        bounds = {
            "test": (0, test_count),
            "validation": (test_count, test_count + validation_count),
            "train": (test_count + validation_count, len(items)),
        }
        start, stop = bounds[split]
        chosen += [items[int(i)] for i in order[start:stop]]
    generator = torch.Generator().manual_seed(seed)
    return [chosen[int(i)] for i in torch.randperm(len(chosen), generator=generator)]


def collate_text_samples(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """A batch of samples that mix numbers, tensors and text.

    ints become an int64 tensor, floats a float32 tensor, tensors are stacked, and strings
    or lists of strings stay Python lists (one entry per sample), which is what text streams
    (`[batch]` or `[batch, -1]` of `str`) carry.
    """
    batch: dict[str, Any] = {}
    for key in samples[0]:
        values = [sample[key] for sample in samples]
        first = values[0]
        if isinstance(first, bool) or not isinstance(first, (int, float, torch.Tensor)):
            batch[key] = values
        elif isinstance(first, int):
            batch[key] = torch.tensor(values, dtype=torch.int64)
        elif isinstance(first, float):
            batch[key] = torch.tensor(values, dtype=torch.float32)
        else:
            batch[key] = torch.stack(values)
    return batch
