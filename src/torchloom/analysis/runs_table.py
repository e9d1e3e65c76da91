"""`loom runs [EXPDIR] [--sort STAT]`: every run under an experiments folder, for model
selection.

A run is a folder `<expdir>/<pipeline>/<stamp>/` with a summary.json (what `loom train`
creates). Statistics for sorting are read at the best epoch (the weights kept in best.pt),
else at the end; test statistics are measured with best.pt. Imports no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torchloom.analysis.run_reading import (
    Run,
    find_runs,
    format_number,
    lower_is_better,
    read_run_or_unreadable,
)
from torchloom.errors import ConfigError, did_you_mean

HEADERS = ["pipeline", "date", "status", "epochs", "best monitored", "test accuracy"]


@dataclass
class RunRow:
    run: Run
    folder: str  # as the user would type it: under the EXPDIR they gave
    sort_value: float | None = None


def list_runs(expdir: str | Path) -> list[RunRow]:
    """Every run under `expdir`, newest first (a ConfigError if it is no folder). A run whose
    summary.json is malformed is listed as unreadable, saying why: one bad folder neither
    hides the others nor passes unnoticed."""
    rows = []
    for path in find_runs(expdir):
        folder = str(Path(expdir) / path.parent.name / path.name)
        rows.append(RunRow(read_run_or_unreadable(path), folder))
    rows.sort(key=lambda row: (row.run.date, row.folder), reverse=True)
    return rows


def sort_runs(rows: list[RunRow], statistic: str, descending: bool | None = None) -> list[RunRow]:
    """Rows sorted by a statistic (best first: highest for accuracy-like names, lowest for
    losses unless `descending` says otherwise); runs without it come last, newest first."""
    values = [row.run.statistic(statistic) for row in rows]
    for row, value in zip(rows, values, strict=True):  # NaN (a diverged run) sorts last
        row.sort_value = None if value is None or math.isnan(value) else value
    if rows and all(value is None for value in values):
        known = {
            key for row in rows for key in (*row.run.final(), *(row.run.summary.get("best") or {}))
        }
        raise ConfigError.at(
            "",
            f"--sort '{statistic}'",
            "no run has this statistic",
            did_you_mean(statistic, known)
            or (
                "use a section.statistic name such as " + ", ".join(sorted(known)[:4])
                if known
                else "no run here has statistics yet (each is running, dead or unreadable)"
            ),
        )
    if descending is None:
        descending = not lower_is_better(statistic, [row.run for row in rows])
    having = [row for row in rows if row.sort_value is not None]
    missing = [row for row in rows if row.sort_value is None]
    having.sort(key=lambda row: float(row.sort_value or 0.0), reverse=descending)
    return having + missing


def table_cells(
    rows: Sequence[RunRow], statistic: str | None = None
) -> tuple[list[str], list[list[str]], set[int]]:
    """Headers, cells and right-aligned columns of the table `loom runs` prints (a column
    for the sort statistic unless it is test accuracy, which has its own)."""
    extra = [statistic] if statistic is not None and statistic != "test.accuracy" else []
    counted = _samples_column(rows, statistic)
    headers = [*HEADERS, *extra, *counted, "folder"]
    lines = []
    for row in rows:
        run = row.run
        name, best, _ = run.monitor()
        monitored = f"{name}={format_number(best)}" if name and best is not None else ""
        epochs = run.summary.get("epochs")
        cells = [
            run.pipeline,
            run.date,
            run.status_text("FOLDER"),  # the folder is the last column
            "" if epochs is None else str(epochs),
            monitored,
            format_number(run.final().get("test.accuracy")),
        ]
        cells += [format_number(run.statistic(name)) for name in extra]
        if counted:
            assert statistic is not None
            samples = run.statistic_and_samples(statistic)[1]
            cells.append("" if samples is None else f"{samples:.0f}")
        lines.append([*cells, row.folder])
    right = {3, 5} | set(range(len(HEADERS), len(headers) - 1))
    return headers, lines, right


def _samples_column(rows: Sequence[RunRow], statistic: str | None) -> list[str]:
    """A column of the samples each run measured `statistic` on, when they differ: a run
    validated on 8 samples and one on 128 are ranked together, and the table says so."""
    if statistic is None:
        return []
    counts = {row.run.statistic_and_samples(statistic)[1] for row in rows}
    counts.discard(None)
    return [f"{statistic.split('.', 1)[0]}.samples"] if len(counts) > 1 else []
