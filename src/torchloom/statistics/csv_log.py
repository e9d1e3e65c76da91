"""Statistics CSV files: one row per logging interval or per epoch.

Columns are fixed by the first row (new keys later extend the header and the file is
rewritten once). On resume the file is cut back to what it held when the checkpoint was
saved: to the row count the checkpoint recorded (exact, also for rows written at the
checkpoint's own episode after it was saved, such as an epoch's row before the save that
ends the epoch), or, for a checkpoint without counts, to the rows up to its episode. So a
killed and resumed run has exactly the rows of an uninterrupted one.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torchloom.data.atomic_files import atomic_file


def _format(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:.8g}"
    return value


class CsvLog:
    def __init__(
        self, path: Path, keep_until_episode: int | None = None, keep_rows: int | None = None
    ) -> None:
        self.path = path
        self.columns: list[str] = []
        self.count = 0  # data rows in the file
        if not path.exists():
            return
        rows = self.rows()
        self.columns = list(rows[0].keys()) if rows else self._header()
        self.count = len(rows)
        if keep_rows is not None:
            kept = rows[:keep_rows]
        elif keep_until_episode is not None:
            kept = [r for r in rows if int(float(r.get("episode") or 0)) <= keep_until_episode]
        else:
            return
        if len(kept) != len(rows):
            self._rewrite(kept)

    def _header(self) -> list[str]:
        with open(self.path, newline="", encoding="utf-8") as handle:
            return next(csv.reader(handle), [])

    def _rewrite(self, rows: Sequence[Mapping[str, Any]]) -> None:
        with atomic_file(self.path) as handle:
            text = io.StringIO(newline="")
            writer = csv.DictWriter(text, self.columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
            handle.write(text.getvalue().encode("utf-8"))
        self.count = len(rows)

    def write(self, row: Mapping[str, Any]) -> None:
        row = {k: _format(v) for k, v in row.items()}
        new = [k for k in row if k not in self.columns]
        if new and self.path.exists() and self.columns:
            existing = self.rows()
            self.columns += new
            self._rewrite(existing)
        elif new:
            self.columns += new
        header = not self.path.exists()
        with open(self.path, "a", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, self.columns, extrasaction="ignore")
            if header:
                writer.writeheader()
            writer.writerow(row)
        self.count += 1

    def rows(self) -> list[dict[str, str]]:
        if not self.path.exists():
            return []
        with open(self.path, newline="", encoding="utf-8") as handle:
            return list(csv.DictReader(handle))
