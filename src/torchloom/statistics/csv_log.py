"""Statistics CSV files: one row per logging interval or per epoch.

Columns are fixed by the first row (new keys later extend the header and the file is
rewritten once). On resume the file is cut back to what it held when the checkpoint was
saved: to the row count the checkpoint recorded (exact, also for rows written at the
checkpoint's own episode after it was saved, such as an epoch's row before the save that
ends the epoch), or, for a checkpoint without counts, to the rows up to its episode. So a
killed and resumed run has exactly the rows of an uninterrupted one.

A long run's file may hold millions of rows: it is read and rewritten a row at a time, never
held whole (reading a million rows as dicts took 7.8 s and 755 MB at each resume). A file
that cannot be read as one (not UTF-8, a cell over csv's limit of 128 KiB, an episode that is
no number) is a StorageError naming it.
"""

from __future__ import annotations

import contextlib
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


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as handle:
        handle.seek(0, 2)
        if handle.tell() == 0:
            return b""
        handle.seek(-1, 2)
        return handle.read(1)


def _csv_line(cells: list[str]) -> str:
    line = io.StringIO(newline="")
    csv.writer(line).writerow(cells)
    return line.getvalue()


def _padded(text: str, missing: int) -> str:
    """A row's text with `missing` empty cells added, ending with a line break (a file
    rewritten from one whose last line had none gets one, so that the next row appended
    starts a line of its own)."""
    body = text.rstrip("\r\n")
    return body + "," * max(missing, 0) + (text[len(body) :] or "\r\n")


class CsvLog:
    def __init__(
        self, path: Path, keep_until_episode: int | None = None, keep_rows: int | None = None
    ) -> None:
        self.path = path
        self.columns: list[str] = []
        self.count = 0  # data rows in the file
        # Whether the next row must first end a last line that has no line break (a file
        # left by a write that was cut short, when nothing is rewritten).
        self._unended = False
        self._headed = False  # the file's header line is there
        if not path.exists():
            return
        rows = self._scan()
        self.columns = next(rows, [])
        self._headed = bool(self.columns)
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
        else:
            self._unended = _last_byte(path) not in (b"", b"\n")

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """The file opened and read inside the block: what goes wrong, a StorageError."""
        try:
            yield
        except (UnicodeDecodeError, csv.Error) as error:
            raise self._damaged(str(error)) from error
        except OSError as error:
            raise StorageError.from_os(self.path, error, "cannot read it") from error

    def _scan(self) -> Iterator[list[str]]:
        """The file's rows as lists of cells, its header first (blank lines skipped)."""
        with self._reading(), open(self.path, newline="", encoding="utf-8") as handle:
            yield from (row for row in csv.reader(handle) if row)

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
            except (ValueError, OverflowError):  # "four", "inf"
                raise self._damaged(f"a row's episode is {text!r}, not a number") from None

        return episode

    def _rewrite(
        self, header: list[str], keep: Callable[[int, list[str]], bool] | None = None
    ) -> None:
        """The file again under `header` (the file's own, or with columns added: rows padded
        with empty cells), with only the rows `keep` takes when given: a row at a time,
        through a temporary file, each row's text copied as it was read (a row wider than the
        file's header, whose extra cells belong to no column, is cut to its width)."""
        width = len(self.columns)
        pieces, count = [_csv_line(header)], 0
        with atomic_file(self.path) as handle:
            rows = self._rows_with_text()
            next(rows, None)
            for index, (row, text) in enumerate(rows):
                if keep is None or keep(index, row):
                    if len(row) > width:
                        text = _csv_line(row[:width])
                    pieces.append(_padded(text, len(header) - min(len(row), width)))
                    count += 1
                if len(pieces) >= 10_000:
                    handle.write("".join(pieces).encode("utf-8"))
                    pieces.clear()
            handle.write("".join(pieces).encode("utf-8"))
        self.columns, self.count, self._headed = header, count, True

    def _rows_with_text(self) -> Iterator[tuple[list[str], str]]:
        """`_scan`'s rows, each with the text it was read from."""
        with self._reading(), open(self.path, newline="", encoding="utf-8") as handle:
            lines = _TakenLines(handle)
            for row in csv.reader(lines):
                text = lines.take()
                if row:
                    yield row, text

    def write(self, row: Mapping[str, Any]) -> None:
        row = {k: _format(v) for k, v in row.items()}
        new = [k for k in row if k not in self.columns]
        if new and self.path.exists() and self.columns:
            self._rewrite(self.columns + new)
        elif new:
            self.columns += new
        # A file there but empty (or blank lines alone) has no header yet either.
        header = not self._headed
        with open(self.path, "a", newline="", encoding="utf-8") as handle:
            if self._unended:
                handle.write("\r\n")
                self._unended = False
            writer = csv.DictWriter(handle, self.columns, extrasaction="ignore")
            if header:
                writer.writeheader()
                self._headed = True
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
