"""Statistics CSV files: one row per logging interval or per epoch.

Columns are fixed by the first row (new keys later extend the header and the file is
rewritten once). On resume, rows past the checkpoint's episode are dropped, so a killed and
resumed run has exactly the rows of an uninterrupted one.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _format(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:.8g}"
    return value


class CsvLog:
    def __init__(self, path: Path, keep_until_episode: int | None = None) -> None:
        self.path = path
        self.columns: list[str] = []
        if path.exists() and keep_until_episode is not None:
            self._truncate(keep_until_episode)
        elif path.exists():
            with open(path, newline="", encoding="utf-8") as handle:
                self.columns = next(csv.reader(handle), [])

    def _truncate(self, episode: int) -> None:
        with open(self.path, newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
            self.columns = list(rows[0].keys()) if rows else []
        kept = [r for r in rows if int(float(r.get("episode") or 0)) <= episode]
        self._rewrite(kept)

    def _rewrite(self, rows: Sequence[Mapping[str, Any]]) -> None:
        temporary = self.path.with_name(f".{self.path.name}.tmp")
        with open(temporary, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, self.columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        os.replace(temporary, self.path)

    def write(self, row: Mapping[str, Any]) -> None:
        row = {k: _format(v) for k, v in row.items()}
        new = [k for k in row if k not in self.columns]
        if new and self.path.exists() and self.columns:
            with open(self.path, newline="", encoding="utf-8") as handle:
                existing = list(csv.DictReader(handle))
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

    def rows(self) -> list[dict[str, str]]:
        if not self.path.exists():
            return []
        with open(self.path, newline="", encoding="utf-8") as handle:
            return list(csv.DictReader(handle))
