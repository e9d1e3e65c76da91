"""Reading a run folder back: its summary, config, statistics CSVs and report files.

Everything here tolerates a run that is still running, was killed, or ran with fewer
analysis items. A missing folder, a missing summary.json, or one whose fields have the wrong
types is an error naming the folder and the field: the accessors of `Run` can then trust
every type. A summary that says "running" is checked against the run's lock, so a run
whose process is gone shows as dead. Imports no torch and no matplotlib, so `loom runs`
stays fast.
"""

from __future__ import annotations

import csv
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from torchloom.analysis.curve_points import Points, read_curves
from torchloom.analysis.file_heads import read_text_head
from torchloom.analysis.summary_types import summary_problems
from torchloom.data.json_files import MAX_RECORD_BYTES, UnreadableJson, read_json
from torchloom.engine.run_lock import Liveness, run_liveness
from torchloom.errors import ConfigError, Problem

SPLITS = ("training", "validation", "test")
# A run's summary.json holds its final statistics and settings: a few kilobytes, a few hundred
# with thousands of statistics. `loom runs` reads every one under a folder.
MAX_SUMMARY_BYTES = MAX_RECORD_BYTES
# Columns of the statistics CSVs that are counters, not statistics.
COUNTERS = frozenset({"epoch", "episode"})
_STAMP = re.compile(r"^(\d{4})(\d{2})(\d{2})_(\d{2})(\d{2})(\d{2})")
_LOWER_IS_BETTER = ("loss", "error", "perplexity", "mse", "mae", "rmse", "wer", "cer")


@dataclass
class Run:
    """One run folder as read from disk. `problem` says why its summary.json cannot be shown
    (the summary is then empty): `loom runs` lists such a folder as unreadable."""

    path: Path
    summary: dict[str, Any]
    problem: str = ""

    @property
    def pipeline(self) -> str:
        return str(self.summary.get("pipeline") or self.path.parent.name)

    @cached_property
    def liveness(self) -> Liveness | None:
        """Whether a process trains in the run now; None unless the summary says "running"
        (a finished summary is final, whoever holds the folder)."""
        return run_liveness(self.path) if self.summary.get("status") == "running" else None

    @property
    def status(self) -> str:
        """The summary's status; "dead" for a "running" run whose process is gone (killed,
        or its machine went down), "unreadable" for a malformed summary.json."""
        if self.problem:
            return "unreadable"
        if self.liveness is not None and not self.liveness.alive:
            return "dead"
        return str(self.summary.get("status", "unknown"))

    def status_detail(self, folder: str | None = None) -> str:
        """Why the status is what it is, where it needs saying: the holder of a running run,
        why a dead one is dead and how to resume it (naming `folder`, the run's path unless
        given), why an unreadable one cannot be read; '' otherwise."""
        if self.problem:
            return self.problem
        live = self.liveness
        if live is None:
            return ""
        if live.alive:
            return live.reason
        if (self.path / "checkpoints" / "last.pt").is_file():
            return f"{live.reason}; resume with loom train --resume {folder or self.path}"
        return f"{live.reason}; no checkpoints/last.pt to resume from"

    def status_text(self, folder: str | None = None) -> str:
        """`status (detail)`, or the status alone."""
        detail = self.status_detail(folder)
        return f"{self.status} ({detail})" if detail else self.status

    @property
    def label(self) -> str:
        """`<pipeline>/<stamp>`: how a run is named on pages and in tables."""
        return f"{self.path.parent.name}/{self.path.name}"

    @property
    def date(self) -> str:
        return run_date(self.path)

    def config_text(self) -> tuple[str, int]:
        """config.yaml's text, at most what a config file may hold (MAX_FILE_BYTES), and the
        file's size (the text is cut when it is larger); ("", 0) when there is none."""
        # Here, not at the top: the config package brings OmegaConf, which `loom runs` skips.
        from torchloom.config.limits import MAX_FILE_BYTES

        path = self.path / "config.yaml"
        if not path.is_file():
            return "", 0
        try:
            return read_text_head(path, MAX_FILE_BYTES)
        except OSError:
            return "", 0

    def final(self) -> dict[str, float]:
        """Final statistics as `section.name -> value` (numbers only)."""
        values: dict[str, float] = {}
        for section, statistics in (self.summary.get("final") or {}).items():
            for name, value in (statistics or {}).items():
                number = as_number(value)
                if number is not None and name not in COUNTERS:
                    values[f"{section}.{name}"] = number
        return values

    def statistic(self, key: str) -> float | None:
        """A statistic for model selection: its value at the best epoch (the weights kept in
        best.pt), else its final value (test statistics are measured with best.pt). An
        online run's best is a partial pass's (a few batches): its section's full pass at
        the end, on the whole set as every other run's, is the one compared."""
        return self.statistic_and_samples(key)[0]

    def statistic_and_samples(self, key: str) -> tuple[float | None, float | None]:
        """`statistic(key)` and the samples of the pass it was measured on (None if unknown)."""
        best, final = self.summary.get("best") or {}, self.final()
        samples = f"{key.split('.', 1)[0]}.samples"
        partial, whole = as_number(best.get(samples)), final.get(samples)
        if partial is not None and whole is not None and partial < whole:
            return final.get(key), whole
        value = as_number(best.get(key))
        if value is not None:
            return value, partial if partial is not None else whole
        return final.get(key), whole

    def monitor(self) -> tuple[str, float | None, int | None]:
        """(name, best value, best epoch) of the monitored statistic; ('', None, None) if none."""
        monitor = self.summary.get("monitor") or {}
        epoch = monitor.get("best_epoch")
        return (
            str(monitor.get("name") or ""),
            as_number(monitor.get("best")),
            int(epoch) if isinstance(epoch, int) else None,
        )

    def history_curves(self, x_column: str) -> dict[str, dict[str, Points]]:
        """split -> statistic -> (xs, ys) against `x_column`, from the per-epoch rows
        (training, validation; test: its one row), in bounded memory (curve_points.py)."""
        found = {}
        for split in SPLITS:
            for name in (f"{split}_epoch_statistics.csv", f"{split}_statistics.csv"):
                if split != "test" and name == f"{split}_statistics.csv":
                    continue  # interval rows: see interval_curves()
                curves = read_curves(self.path / name, x_column)
                if curves:
                    found[split] = curves
                    break
        return found

    @cached_property
    def unreadable_statistics(self) -> list[str]:
        """`NAME: why` for each statistics CSV of the run that exists but cannot be read as
        one (not UTF-8 text, no episode column, a malformed row): its curves are missing
        from the pages, which must say so rather than show the others as the whole run.
        Read once per `Run` (the page and the command both say it; a file may be large)."""
        found = []
        for path in sorted(self.path.glob("*statistics.csv")):
            try:
                with open(path, newline="", encoding="utf-8") as handle:
                    reader = csv.reader(handle)  # rows as lists: a million in a second
                    if "episode" not in next(reader, []):
                        found.append(f"{path.name}: has no episode column")
                        continue
                    for _ in reader:
                        pass
            except UnicodeDecodeError as error:
                found.append(f"{path.name}: not UTF-8 text ({error.reason})")
            except (OSError, csv.Error) as error:
                found.append(f"{path.name}: {error}")
        return found

    def interval_curves(self) -> dict[str, Points]:
        """Training statistics at the logging interval against the episode ({} when none
        were logged), in bounded memory."""
        return read_curves(self.path / "training_statistics.csv", "episode")

    def reports(self, pattern: str) -> list[Path]:
        """Files under `reports/` matching a glob, sorted by name; [] when there are none."""
        folder = self.path / "reports"
        return sorted(p for p in folder.glob(pattern) if p.is_file()) if folder.is_dir() else []


def _not_a_run(path: Path, message: str) -> ConfigError:
    return ConfigError([Problem("", f"run folder '{path}'", message)])


def read_run(path: str | Path) -> Run:
    """The run in `path`, or a ConfigError naming the folder when it is not a run or its
    summary.json is malformed (naming the field)."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise _not_a_run(folder, "does not exist" if not folder.exists() else "is not a folder")
    summary_path = folder / "summary.json"
    if not summary_path.is_file():
        raise _not_a_run(
            folder,
            "has no summary.json: not a run folder (loom train writes <expdir>/<pipeline>/<date>/)",
        )
    try:
        summary = read_json(summary_path, MAX_SUMMARY_BYTES)
    except UnreadableJson as error:
        raise _not_a_run(folder, f"summary.json {error}") from error
    if not isinstance(summary, dict):
        raise _not_a_run(folder, "summary.json is not a JSON object")
    wrong = summary_problems(summary)
    if wrong:
        raise ConfigError([Problem("", f"run folder '{folder}'", message) for message in wrong])
    return Run(folder.resolve(), summary)


def read_run_or_unreadable(path: Path) -> Run:
    """The run in `path`; one whose summary.json cannot be read or has a malformed field as
    an unreadable Run (empty summary, `problem` saying why), so that a listing shows it."""
    try:
        return read_run(path)
    except ConfigError as error:
        why = "; ".join(problem.message for problem in error.problems)
        return Run(Path(path).expanduser().resolve(), {}, why)


def find_runs(expdir: str | Path) -> list[Path]:
    """Run folders under an experiments folder: `<expdir>/<pipeline>/<stamp>/summary.json`."""
    folder = Path(expdir).expanduser()
    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is not a folder"
        raise ConfigError.at(
            "", f"experiments folder '{expdir}'", what, "pass the --expdir of loom train"
        )
    return sorted(p.parent for p in folder.glob("*/*/summary.json") if p.is_file())


def run_date(path: Path) -> str:
    """`YYYY-mm-dd HH:MM:SS` from a run folder's name, else from its summary's file time."""
    match = _STAMP.match(path.name)
    if match:
        y, mo, d, h, mi, s = match.groups()
        return f"{y}-{mo}-{d} {h}:{mi}:{s}"
    try:
        stamp = (path / "summary.json").stat().st_mtime
    except OSError:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def as_number(value: Any) -> float | None:
    """A finite-or-not float from a JSON or CSV value; None for anything else."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def lower_is_better(name: str, runs: Sequence[Run] = ()) -> bool:
    """Direction of a statistic: the mode of a run of `runs` that monitors it, else by its
    name: a loss, an error, a perplexity, ... falls (a whole word of its last part: `loss_a`,
    `loss_std`, `val_mse`; not `answer_accuracy`, which holds "wer"), everything else rises."""
    for run in runs:
        monitor = run.summary.get("monitor") or {}
        if monitor.get("name") == name and monitor.get("mode") in ("min", "max"):
            return bool(monitor["mode"] == "min")
    words = re.split(r"[^a-z0-9]+", name.rsplit(".", 1)[-1].lower())
    return any(word in _LOWER_IS_BETTER for word in words)


def plotted_statistics(columns: set[str]) -> list[str]:
    """Statistics worth a history curve: no counters, spreads (`_min`/`_max`/`_std`) or
    sample counts."""
    skipped = COUNTERS | {"samples"}
    return sorted(
        c for c in columns if c not in skipped and not c.endswith(("_min", "_max", "_std"))
    )


def format_number(value: float | None) -> str:
    if value is None:
        return ""
    if math.isnan(value) or math.isinf(value):
        return str(value)
    if value == int(value) and abs(value) < 1e12:
        return str(int(value))
    # Four decimals for accuracies and losses; four significant figures below 0.1, where
    # decimals would show the learning rates 0.00443 and 0.00431 as one 0.0044 and 0.0043.
    return f"{value:.4f}" if 0.1 <= abs(value) < 1000 else f"{value:.4g}"


# ---- markdown (the analysis reports are tiny markdown files) --------------------------------
def markdown_blocks(text: str) -> list[tuple[str, Any]]:
    """Markdown as blocks: ('heading', (level, text)), ('table', [header, *rows]),
    ('list', [items]), ('code', text), ('paragraph', text). Enough for pipe tables, headings,
    bullet lists and fenced code; anything else is a paragraph."""
    blocks: list[tuple[str, Any]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        stripped = line.strip()
        if not stripped:
            i += 1
        elif stripped.startswith("```"):
            end = i + 1
            while end < len(lines) and not lines[end].strip().startswith("```"):
                end += 1
            blocks.append(("code", "\n".join(lines[i + 1 : end])))
            i = end + 1
        elif stripped.startswith("#"):
            level = len(stripped) - len(stripped.lstrip("#"))
            blocks.append(("heading", (min(level, 6), stripped[level:].strip())))
            i += 1
        elif stripped.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].strip().startswith("|"):
                cells = _pipe_cells(lines[i].strip())
                separator = any(cells) and all(re.fullmatch(r":?-+:?", c) for c in cells if c)
                if not separator:
                    rows.append(cells)
                i += 1
            blocks.append(("table", rows))
        elif re.match(r"^[-*+] ", stripped):
            items = []
            while i < len(lines) and re.match(r"^\s*[-*+] ", lines[i]):
                items.append(lines[i].strip()[2:].strip())
                i += 1
            blocks.append(("list", items))
        else:
            paragraph = []
            while i < len(lines) and lines[i].strip() and not _starts_block(lines[i].strip()):
                paragraph.append(lines[i].strip())
                i += 1
            blocks.append(("paragraph", " ".join(paragraph)))
    return blocks


def _starts_block(line: str) -> bool:
    return line.startswith(("#", "|", "```")) or bool(re.match(r"^[-*+] ", line))


def _pipe_cells(line: str) -> list[str]:
    inner = line[1:-1] if line.endswith("|") and len(line) > 1 else line[1:]
    cells = re.split(r"(?<!\\)\|", inner)
    return [c.strip().replace("\\|", "|") for c in cells]
