"""Reading the files of a run folder, which may come from someone else and be of any size,
in bounded memory: CSV rows one at a time, the first rows of a CSV with its row count, the
first bytes of a text file with its size. Imports no torch and no matplotlib."""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from pathlib import Path


def csv_rows(path: Path) -> Iterator[dict[str, str]]:
    """A CSV file's rows one at a time (none when the file is missing or unreadable; a
    malformed row ends them): a file of any size read in the memory of one row."""
    if not path.is_file():
        return
    try:
        with open(path, newline="", encoding="utf-8", errors="replace") as handle:
            yield from csv.DictReader(handle)
    except (OSError, csv.Error):
        return


def read_csv_head(path: Path, limit: int) -> tuple[list[dict[str, str]], int]:
    """The first `limit` rows of a CSV file and how many it has, in the memory of those."""
    head: list[dict[str, str]] = []
    total = 0
    for row in csv_rows(path):
        total += 1
        if total <= limit:
            head.append(row)
    return head, total


def read_text_head(path: Path, limit: int) -> tuple[str, int]:
    """The first `limit` bytes of a file as text (bytes that are no UTF-8 replaced) and the
    file's size: a file of a run folder from someone else may be of any size."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        data = handle.read(limit)
    return data.decode("utf-8", errors="replace"), size
