"""Curves read from a statistics CSV in bounded memory.

A long run logs a row every few steps, and a run folder received from someone else may hold
any file: reading a CSV of a million rows as dicts took 2.2 GB and 40 s (`loom report`, and
the history plots after every epoch of a run), and a picture of it keeps a few thousand
points' worth of pixels. The file is read row by row; each column's points go to an
`Envelope`, which keeps every point while there are few and, beyond `MAX_BUCKETS` buckets,
the lowest and the highest point of each bucket of consecutive rows, so a spike stays in the
curve. Every point drawn is one of the file's. Imports no torch and no matplotlib.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

# Buckets an envelope keeps: up to twice as many points (a bucket's lowest and highest), a
# few per pixel of the widest figure drawn.
MAX_BUCKETS = 2000

Points = tuple[list[float], list[float]]
# The end of the last line a followed file was read to, compared at the next read.
TAIL_BYTES = 256


def finite(value: Any) -> float | None:
    """A finite float from a CSV cell or a JSON value; None for anything else."""
    if isinstance(value, bool):
        return None
    try:
        return _finite_text(value)
    except TypeError:  # None, a list, ...
        return None


def _finite_text(text: str) -> float | None:
    """`finite` for a CSV cell, without its checks of other types (a call per cell)."""
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


class Envelope:
    """The points of one curve, in the order added: all of them up to `limit` buckets; past
    that, consecutive buckets merge in pairs (each keeps its lowest and its highest point),
    so the rows per bucket double and memory stays within `limit` buckets."""

    def __init__(self, limit: int = MAX_BUCKETS) -> None:
        self.limit = max(limit, 1)
        self.rows_per_bucket = 1
        # One list per bucket: [rows, x of the lowest, lowest, x of the highest, highest].
        self.buckets: list[list[float]] = []
        # The curve's first and latest points are drawn whatever the buckets keep, so that it
        # spans the run and ends on its last value.
        self.first: tuple[float, float] | None = None
        self.latest: tuple[float, float] | None = None

    def add(self, x: float, y: float) -> None:
        if self.first is None:
            self.first = (x, y)
        self.latest = (x, y)
        self._add(x, y)

    def _add(self, x: float, y: float) -> None:
        last = self.buckets[-1] if self.buckets else None
        if last is None or last[0] >= self.rows_per_bucket:
            if len(self.buckets) == self.limit:
                self._halve()
                self._add(x, y)
                return
            self.buckets.append([1, x, y, x, y])
            return
        last[0] += 1
        if y < last[2]:
            last[1], last[2] = x, y
        if y > last[4]:
            last[3], last[4] = x, y

    def _halve(self) -> None:
        merged = []
        for first, second in zip(self.buckets[::2], self.buckets[1::2], strict=False):
            low = first if first[2] <= second[2] else second
            high = first if first[4] >= second[4] else second
            merged.append([first[0] + second[0], low[1], low[2], high[3], high[4]])
        if len(self.buckets) % 2:
            merged.append(self.buckets[-1])
        self.buckets = merged
        self.rows_per_bucket *= 2

    def points(self) -> Points:
        """(xs, ys): every point added, or the first, each bucket's lowest and highest and
        the latest, in row order."""
        kept: list[tuple[float, float]] = []
        for _, x_low, low, x_high, high in self.buckets:
            kept += sorted({(x_low, low), (x_high, high)})  # in x order; one if they are one
        # The first and latest points, unless their buckets kept them (as they keep every
        # point while the rows per bucket are one).
        if self.first is not None and kept[0] != self.first:
            kept.insert(0, self.first)
        if self.latest is not None and kept[-1] != self.latest:
            kept.append(self.latest)
        return [x for x, _ in kept], [y for _, y in kept]


class Curves:
    """Envelopes by column (those `plotted` accepts) against one x column, fed a row at a
    time; `last_row` is the last row read (the history plots add a row the engine has not
    written yet only when it is not that one)."""

    def __init__(self, x_column: str, plotted: Callable[[str], bool] = bool) -> None:
        self.x_column, self.plotted = x_column, plotted
        self.envelopes: dict[str, Envelope] = {}
        self.last_row: Mapping[str, Any] | None = None
        self.header: list[str] = []
        # (index, name) of the plotted columns, and the x column's index; None until a
        # header with the x column is read.
        self._columns: list[tuple[int, str]] | None = None
        self._at = 0

    def _envelope(self, column: str) -> Envelope:
        envelope = self.envelopes.get(column)
        if envelope is None:  # made for a column's first finite value only
            envelope = self.envelopes[column] = Envelope()
        return envelope

    def read(self, path: Path) -> Curves:
        """Adds every row of a CSV file (nothing when it is missing or unreadable; a malformed
        row ends the reading), a row at a time: a million rows in a few seconds."""
        if not path.is_file():
            return self
        try:
            with open(path, newline="", encoding="utf-8", errors="replace") as handle:
                reader = csv.reader(handle)
                self.start(next(reader, None))
                self.feed(reader)
        except (OSError, csv.Error):
            pass
        return self

    def start(self, header: list[str] | None) -> None:
        """Takes the file's header row: rows fed from now on are read by its columns (none,
        when it has no x column)."""
        self.header, self._columns = list(header or []), None
        if self.x_column in self.header:
            self._at = self.header.index(self.x_column)
            self._columns = [
                (index, name)
                for index, name in enumerate(self.header)
                if name and index != self._at and self.plotted(name)
            ]

    def feed(self, reader: Iterable[list[str]]) -> None:
        """Adds the rows of `reader` (csv.reader's lists, after the header given to `start`)."""
        if self._columns is None:
            return
        columns, at = self._columns, self._at
        last: list[str] = []
        try:
            for row in reader:
                if row:  # a blank line is no row (as csv.DictReader has it)
                    last = row
                if len(row) <= at:
                    continue
                x = _finite_text(row[at])
                if x is None:
                    continue
                for index, name in columns:
                    if index < len(row):
                        y = _finite_text(row[index])
                        if y is not None:
                            self._envelope(name).add(x, y)
        finally:  # also before a malformed row: the last row added
            if last:
                self.last_row = dict(zip(self.header, last, strict=False))

    def points(self, extra: Mapping[str, Any] | None = None) -> dict[str, Points]:
        """(xs, ys) by column; `extra`, a row that is not kept (one the engine has not written
        yet), is drawn as each of its columns' latest point."""
        points = {key: envelope.points() for key, envelope in self.envelopes.items()}
        x = None if extra is None else finite(extra.get(self.x_column))
        if extra is None or x is None:
            return points
        for key, value in extra.items():
            if not key or key == self.x_column or not self.plotted(key):
                continue
            y = finite(value)
            if y is not None:
                xs, ys = points.setdefault(key, ([], []))
                xs.append(x)
                ys.append(y)
        return points


class FollowedCurves:
    """The curves of a CSV file that grows by appended rows (a run's statistics, drawn after
    each epoch while the run writes them): each `update` reads only the complete rows
    written since the last one, so a long run's plots cost the new rows, not the whole file
    again. A file that was replaced (the engine rewrites it when a statistic is new) or cut
    is read again from its start; after a malformed row nothing more is read from it."""

    def __init__(self, path: Path, x_column: str, plotted: Callable[[str], bool] = bool) -> None:
        self.path, self.x_column, self.plotted = path, x_column, plotted
        self._restart(None)

    def _restart(self, identity: tuple[int, int] | None) -> None:
        self.curves = Curves(self.x_column, self.plotted)
        self.identity = identity  # (device, inode) of the file read
        self.offset = 0  # bytes read, up to the end of the last complete line
        self.head = b""  # the header line read
        self.tail = b""  # the end of the last line read, just before `offset`
        self.stopped = False

    def update(self) -> Curves:
        try:
            status = self.path.stat()
        except OSError:
            self._restart(None)  # gone: no curves
            return self.curves
        identity = (status.st_dev, status.st_ino)
        if identity != self.identity or status.st_size < self.offset:
            self._restart(identity)
        if self.stopped or status.st_size == self.offset:
            return self.curves
        try:
            with open(self.path, "rb") as handle:
                if self.offset and not self._same_file(handle):
                    self._restart(identity)
                handle.seek(self.offset)
                reader = csv.reader(self._complete_lines(handle))
                if self.offset == 0:
                    header = next(reader, None)
                    if header is None:
                        return self.curves  # not even a whole header line yet
                    self.curves.start(header)
                    handle.seek(0)
                    self.head = handle.read(self.offset)
                    handle.seek(self.offset)
                self.curves.feed(reader)
        except (OSError, csv.Error):
            self.stopped = True
        return self.curves

    def _same_file(self, handle: BinaryIO) -> bool:
        """Whether the file still begins with the header read and holds the last line read
        where it was: else it was replaced or rewritten since (a new file may get the
        inode number of a deleted one)."""
        if handle.read(len(self.head)) != self.head:
            return False
        handle.seek(self.offset - len(self.tail))
        return handle.read(len(self.tail)) == self.tail

    def _complete_lines(self, handle: BinaryIO) -> Iterator[str]:
        """The lines from the handle's position that end with a newline, counted into
        `offset` as csv.reader takes them (a line still being written waits for the next
        update)."""
        for line in handle:
            if not line.endswith(b"\n"):
                return
            self.offset += len(line)
            self.tail = line[-TAIL_BYTES:]
            yield line.decode("utf-8", errors="replace")


def read_curves(path: Path, x_column: str) -> dict[str, Points]:
    """Every numeric column of a CSV file against `x_column` (the columns with at least one
    finite value), as (xs, ys) in bounded memory; {} when the file is missing or unreadable."""
    return Curves(x_column).read(path).points()
