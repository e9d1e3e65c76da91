"""Statistics CSV files: one row per logging interval or per epoch.

Columns are fixed by the first row (new keys later extend the header and the file is
rewritten once). On resume the file is cut back to what it held when the checkpoint was
saved: to the row count the checkpoint recorded (exact, also for rows written at the
checkpoint's own episode after it was saved, such as an epoch's row before the save that
ends the epoch), or, for a checkpoint without counts, to the rows up to its episode. So a
killed and resumed run has exactly the rows of an uninterrupted one.

A long run's file may hold millions of rows: it is read and rewritten a row at a time, never
held whole (reading a million rows as dicts took 7.8 s and 740 MB at each resume). A file
that cannot be read as one (not UTF-8, a malformed row) is a StorageError naming it.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from torchloom.data.atomic_files import atomic_file
from torchloom.errors import StorageError


def _format(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:.8g}"
    return value


class _TakenLines:
    """The lines of a file, remembering those read since the last `take()`: the text of the
    row csv.reader made of them (one line, or more for a quoted cell with line breaks)."""

    def __init__(self, lines: Iterator[str]) -> None:
        self.lines, self.taken = lines, list[str]()

    def __iter__(self) -> _TakenLines:
        return self

    def __next__(self) -> str:
        line = next(self.lines)
        self.taken.append(line)
        return line

    def take(self) -> str:
        text = "".join(self.taken)
        self.taken.clear()
        return text


def _padded(text: str, missing: int) -> str:
    """A row's text with `missing` empty cells added, ending with a line break (the last
    line of a file may have none, and the next row is appended after it)."""
    body = text.rstrip("\r\n")
    return body + "," * max(missing, 0) + (text[len(body) :] or "\r\n")


class CsvLog:
    def __init__(
        self, path: Path, keep_until_episode: int | None = None, keep_rows: int | None = None
    ) -> None:
        self.path = path
        self.columns: list[str] = []
        self.count = 0  # data rows in the file
        if not path.exists():
            return
        rows = self._scan()
        self.columns = next(rows, [])
        episode = self._episode_reader(self.columns)

        def keep(index: int, row: list[str]) -> bool:
            if keep_rows is not None:
                return index < keep_rows
            return keep_until_episode is None or episode(row) <= keep_until_episode

        kept = 0
        for index, row in enumerate(rows):
            self.count += 1
            kept += keep(index, row)
        if kept != self.count:
            self._rewrite(self.columns, keep)

    def _scan(self) -> Iterator[list[str]]:
        """The file's rows as lists of cells, its header first (blank lines skipped)."""
        try:
            with open(self.path, newline="", encoding="utf-8") as handle:
                yield from (row for row in csv.reader(handle) if row)
        except (UnicodeDecodeError, csv.Error) as error:
            raise self._damaged(str(error)) from error
        except OSError as error:
            raise StorageError.from_os(self.path, error, "cannot read it") from error

    def _damaged(self, reason: str) -> StorageError:
        return StorageError.at(
            "",
            f"'{self.path}'",
            f"cannot be read as a statistics file: {reason}",
            "restore it from a copy, or move it out of the run folder (the run goes on "
            "without its rows)",
        )

    def _episode_reader(self, header: list[str]) -> Callable[[list[str]], int]:
        """A row's episode (0 where it has none), for a file with this header."""
        index = header.index("episode") if "episode" in header else None

        def episode(row: list[str]) -> int:
            text = row[index] if index is not None and index < len(row) else ""
            try:
                return int(float(text or 0))
            except ValueError:
                raise self._damaged(f"a row's episode is {text!r}, not a number") from None

        return episode

    def _rewrite(
        self, header: list[str], keep: Callable[[int, list[str]], bool] | None = None
    ) -> None:
        """The file again under `header` (rows padded to its width with empty cells), with
        only the rows `keep` takes when given: each row's text copied as it was read, a row
        at a time, through a temporary file."""
        heading = io.StringIO(newline="")
        csv.writer(heading).writerow(header)
        pieces, count = [heading.getvalue()], 0
        with atomic_file(self.path) as handle:
            rows = self._rows_with_text()
            next(rows, None)
            for index, (row, text) in enumerate(rows):
                if keep is None or keep(index, row):
                    pieces.append(_padded(text, len(header) - len(row)))
                    count += 1
                if len(pieces) >= 10_000:
                    handle.write("".join(pieces).encode("utf-8"))
                    pieces.clear()
            handle.write("".join(pieces).encode("utf-8"))
        self.columns, self.count = header, count

    def _rows_with_text(self) -> Iterator[tuple[list[str], str]]:
        """`_scan`'s rows, each with the text it was read from."""
        try:
            with open(self.path, newline="", encoding="utf-8") as handle:
                lines = _TakenLines(handle)
                for row in csv.reader(lines):
                    text = lines.take()
                    if row:
                        yield row, text
        except (UnicodeDecodeError, csv.Error) as error:
            raise self._damaged(str(error)) from error
        except OSError as error:
            raise StorageError.from_os(self.path, error, "cannot read it") from error

    def write(self, row: Mapping[str, Any]) -> None:
        row = {k: _format(v) for k, v in row.items()}
        new = [k for k in row if k not in self.columns]
        if new and self.path.exists() and self.columns:
            self._rewrite(self.columns + new)
        elif new:
            self.columns += new
        header = not self.path.exists()
        with open(self.path, "a", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, self.columns, extrasaction="ignore")
            if header:
                writer.writeheader()
            writer.writerow(row)
        self.count += 1

    def rows(self, episode: int | None = None) -> list[dict[str, str]]:
        """Every row, or those of `episode`: read a row at a time, so that only the rows
        asked for are held (a long run's training rows are millions)."""
        if not self.path.exists():
            return []
        rows = self._scan()
        header = next(rows, [])
        of = self._episode_reader(header)
        return [
            dict(zip(header, row + [""] * (len(header) - len(row)), strict=False))
            for row in rows
            if episode is None or of(row) == episode
        ]
