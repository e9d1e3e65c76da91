"""The searches under an experiments folder, for `loom runs`: one row per search folder, read
from its search.json and trials.csv (no study is opened, so listing stays fast and works
while searches run; `loom report SEARCH_DIR` refreshes trials.csv)."""

from __future__ import annotations

import csv
from pathlib import Path

from torchloom.analysis.run_reading import format_number
from torchloom.search.record import RECORD, read_record

HEADERS = ["search", "date", "monitor", "trials", "best", "folder"]


def list_searches(expdir: str | Path) -> list[list[str]]:
    rows = []
    for record_file in sorted(Path(expdir).expanduser().glob(f"searches/*/*/{RECORD}")):
        folder = record_file.parent
        try:
            record = read_record(folder)
        except Exception:  # a damaged search.json: listed without details
            rows.append([folder.parent.name, folder.name, "?", "?", "?", str(folder)])
            continue
        states: dict[str, int] = {}
        values: list[float] = []
        damaged = ""
        try:
            with open(folder / "trials.csv", newline="", encoding="utf-8") as handle:
                for row in csv.DictReader(handle):
                    states[row["state"]] = states.get(row["state"], 0) + 1
                    if row["state"] == "complete" and row.get(record.monitor):
                        values.append(float(row[record.monitor]))
        except FileNotFoundError:
            pass  # still running its first trials
        except (OSError, ValueError, KeyError, csv.Error) as error:  # UnicodeDecodeError too
            # One damaged file must not hide every other run and search from the listing.
            damaged = f"? (trials.csv cannot be read: {error}; loom report {folder} rebuilds it)"
        counts = ", ".join(f"{n} {s}" for s, n in states.items()) or "none written yet"
        best = (max(values) if record.mode == "max" else min(values)) if values else None
        rows.append(
            [
                record.name,
                folder.name,
                f"{record.mode} {record.monitor}",
                damaged or f"{counts} (of {record.trials})",
                "?" if damaged else format_number(best) or "-",
                str(folder),
            ]
        )
    return rows
