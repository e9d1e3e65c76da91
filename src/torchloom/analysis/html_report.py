"""`loom report RUN_DIR`: one self-contained HTML page about a run.

Everything the run left behind that helps to understand it goes on one page readable from a
file, without a server: summary and config, history curves, confusion matrices and per-class
tables, ROC curves, worst samples, sample grids, layer statistics, the model summary, viewer
images. Images are embedded as base64 data URIs; the page has inline CSS, no JavaScript and
no external URL (the building blocks: html_parts.py). Every analysis file is optional: the
page shows what exists. All text from the run is escaped (a config value may contain
anything).
"""

from __future__ import annotations

import time
from pathlib import Path

from torchloom.analysis.file_heads import csv_rows, read_csv_head, read_text_head
from torchloom.analysis.html_parts import (
    TABLE_ROWS,
    csv_table,
    escape,
    figure,
    gallery,
    line_plot,
    markdown_html,
    page,
    png_file_figure,
    table,
)
from torchloom.analysis.run_reading import Run, format_number, plotted_statistics, read_run
from torchloom.analysis.skipped import read_skipped
from torchloom.config.limits import MAX_FILE_BYTES
from torchloom.data.atomic_files import write_text_atomic
from torchloom.errors import ConfigError, Problem

# A markdown report shown in the page, in bytes at most.
MAX_MARKDOWN_BYTES = 1_000_000

BAD_STATUSES = ("diverged", "interrupted", "running", "dead", "failed", "error", "unknown")


def history_plots(run: Run, skip_lr: bool = False) -> list[tuple[str, bytes]]:
    """(statistic, PNG) per statistic: one line per split against the episode, and the
    training rows at the logging interval where there are any."""
    history = run.history_curves("episode")
    columns = {column for curves in history.values() for column in curves}
    named = [("training (interval)", run.interval_curves()), *history.items()]
    plots = []
    for statistic in plotted_statistics(columns - ({"lr"} if skip_lr else set())):
        series = [(name, *curves[statistic]) for name, curves in named if statistic in curves]
        if series:
            plots.append((statistic, line_plot(statistic, series)))
    return plots


# ---- the report's sections -----------------------------------------------------------------
class _Files:
    """The run's report files by glob, remembering which ones a section has shown, so that
    any further file an analysis writes still appears (under 'Other analysis files')."""

    def __init__(self, run: Run) -> None:
        self.run, self.shown = run, set[Path]()

    def __call__(self, pattern: str) -> list[Path]:
        found = self.run.reports(pattern)
        self.shown.update(found)
        return found


def _summary(run: Run) -> list[str]:
    s, status = run.summary, run.status
    name, best, epoch = run.monitor()
    best_text = f"{name} = {format_number(best)}" if name and best is not None else name or "-"
    if epoch is not None and best is not None:
        best_text += f" (epoch {epoch})"
    wall = s.get("wall_time_seconds")
    rows = [
        ("reason", s.get("reason")),
        ("epochs", s.get("epochs")),
        ("episodes", s.get("episodes")),
        ("wall time", f"{wall} s" if wall is not None else None),
        ("seed", s.get("seed")),
        ("device", s.get("device")),
        ("best monitored statistic", best_text),
    ]
    css = "status-bad" if status in BAD_STATUSES else "status-ok"
    parts = [
        f'<p>status: <span class="{css}">{escape(run.status_text())}</span></p>',
        table(["", "value"], [[k, "" if v is None else str(v)] for k, v in rows]),
    ]
    final = s.get("final") or {}
    sections = [k for k in ("training", "validation", "test") if k in final]
    sections += [k for k in final if k not in sections]
    names: list[str] = []
    for section in sections:
        names += [n for n in final[section] if n not in names and n not in ("epoch", "episode")]
    if names:
        body = [[n, *[final[sec].get(n, "") for sec in sections]] for n in names]
        parts += ["<h3>Final statistics</h3>", table(["statistic", *sections], body)]
    return parts


def _history(run: Run, files: _Files) -> list[str]:
    pngs, lr = files("history/*.png"), files("learning_rate.png")
    parts = [gallery(pngs)]
    # No history analysis, or pictures older than the statistics (a run drawn during
    # training and stopped or killed before it drew them again): curves from the CSVs.
    csvs = list(run.path.glob("*statistics.csv"))
    stale = bool(pngs) and max((p.stat().st_mtime for p in csvs), default=0.0) > min(
        p.stat().st_mtime for p in pngs
    )
    if not pngs or stale:
        plots = history_plots(run, skip_lr=bool(lr))
        parts = [figure(data, name, show_caption=False) for name, data in plots]
    unreadable = [f"<li>{escape(problem)}</li>" for problem in run.unreadable_statistics]
    if unreadable:
        notice = "<p>Not shown: these statistics files cannot be read.</p>"
        parts = [notice, "<ul>" + "".join(unreadable) + "</ul>", *parts]
    return parts + [png_file_figure(p, "learning rate") for p in lr]


def _classification(run: Run, files: _Files) -> list[str]:
    by_stem: dict[str, dict[str, Path]] = {}
    for suffix in ("-cm.png", "-roc.png", "-cm.csv", "-report.md", "-errors.csv"):
        for path in files(f"*{suffix}"):
            by_stem.setdefault(path.name[: -len(suffix)], {})[suffix] = path
    parts = []
    for stem, found in by_stem.items():
        parts.append(f"<h3>{escape(stem)}</h3>")
        images = [png_file_figure(found[s]) for s in ("-cm.png", "-roc.png") if s in found]
        parts.append(f'<div class="wide">{"".join(images)}</div>' if images else "")
        if "-cm.png" not in found and "-cm.csv" in found:
            parts += ["<p>normalised confusion matrix</p>", csv_table(found["-cm.csv"])]
        if "-report.md" in found:
            parts.append(_markdown_file(found["-report.md"]))
        if "-errors.csv" in found:
            errors, total = read_csv_head(found["-errors.csv"], 20)
            parts.append(f"<p>{total} prediction errors (the first 20):</p>")
            parts.append(csv_table(found["-errors.csv"], errors) if errors else "")
    return parts


def _worst(files: _Files) -> list[str]:
    """Heat-maps (one per output, prefixed when there are several), the tables of the
    hardest samples, their texts (markdown) and their images."""
    parts = [gallery(files("worst_samples/*heatmap.png"), "wide")]
    parts += [csv_table(p) for p in files("worst_samples/*.csv")]
    parts += [_markdown_file(p) for p in files("worst_samples/*.md")]
    images = [p for p in files("worst_samples/**/*.png") if not p.name.endswith("heatmap.png")]
    return [*parts, gallery(images)]


def _layers(files: _Files) -> list[str]:
    paths = files("layer_statistics.csv")
    # Read a row at a time: a measurement every few steps of a long run is a long file.
    last_row: dict[str, str] | None = None
    by_layer: dict[str, dict[str, str]] = {}
    more = 0  # layers past the table's TABLE_ROWS
    for row in csv_rows(paths[0]) if paths else ():
        last_row = row
        name = next((row[h] for h in ("layer", "name", "module") if h in row), None)
        if name is not None and (name in by_layer or len(by_layer) < TABLE_ROWS):
            by_layer[name] = row
        elif name is not None:
            more += 1
    if last_row is None:
        return []
    if not by_layer:  # one column per layer statistic: the last row, one value per line
        last = [{"column": k, "last value": v or ""} for k, v in last_row.items()]
        content = csv_table(paths[0], last)
    else:  # one row per layer and measurement: the last measurement of each layer
        content = csv_table(paths[0], list(by_layer.values()))
        if more:
            content += f'<p class="absent">the first {TABLE_ROWS:,} layers; {more:,} rows '
            content += "of further layers not shown</p>"
    return [f"<p>last measurement per layer, from {escape(paths[0].name)}</p>", content]


def _skipped(run: Run) -> list[str]:
    """The items that were on but did not run, one row per reason (reports/skipped.json)."""
    by_reason: dict[str, list[str]] = {}
    for item, why in read_skipped(run.path).items():
        by_reason.setdefault(why, []).append(item)
    rows = [[", ".join(items), why] for why, items in by_reason.items()]
    return [table(["item (on, but did not run)", "why"], rows)] if rows else []


def _markdown_file(path: Path) -> str:
    """A report's markdown as HTML: its first MAX_MARKDOWN_BYTES (the model summary of a
    large model takes tens of kilobytes), saying so when the file is longer."""
    try:
        text, size = read_text_head(path, MAX_MARKDOWN_BYTES)
    except OSError as error:
        return f'<p class="absent">{escape(path.name)}: cannot be read ({escape(error)})</p>'
    html = markdown_html(text)
    if size > MAX_MARKDOWN_BYTES:
        html += f'<p class="absent">{escape(path.name)}: the first {MAX_MARKDOWN_BYTES:,} of '
        html += f"{size:,} bytes</p>"
    return html


def _section(anchor: str, title: str, parts: list[str]) -> str:
    parts = [p for p in parts if p]
    return f'<h2 id="{anchor}">{escape(title)}</h2>\n' + "\n".join(parts) if parts else ""


def report_html(run: Run) -> str:
    files = _Files(run)
    viewer_pngs = sorted((run.path / "viewers").glob("*.png"))
    samples = files("samples/*.png")
    built = [  # (anchor, title, parts); the order is the page's
        ("skipped", "Skipped analysis", _skipped(run)),
        ("history", "History", _history(run, files)),
        ("classification", "Classification reports", _classification(run, files)),
        ("worst", "Worst samples", _worst(files)),
        ("samples", "Samples", [gallery(samples, "full")]),
        ("layers", "Layer statistics", _layers(files)),
        ("model", "Model summary", [_markdown_file(p) for p in files("model_summary.md")]),
        ("viewers", "Viewer images", [gallery(viewer_pngs, "full")]),
    ]
    others = [gallery([p for p in run.reports("**/*.png") if p not in files.shown], "wide")]
    others += [_markdown_file(p) for p in run.reports("**/*.md") if p not in files.shown]
    built.append(("other", "Other analysis files", others))
    present = [(anchor, title, parts) for anchor, title, parts in built if any(parts)]
    absent = [t for a, t, parts in built if not any(parts) and a not in ("other", "skipped")]
    links = [("summary", "Summary"), *((a, t) for a, t, _ in present), ("config", "Config")]
    config_text, config_size = run.config_text()
    if config_size > MAX_FILE_BYTES:
        config_text += f"\n... (cut: config.yaml has {config_size:,} bytes, more than a config)"
    written = time.strftime("%Y-%m-%d %H:%M:%S")
    body = [
        f"<h1>Run report: {escape(run.pipeline)}</h1>",
        f'<p class="meta">{escape(run.path)} &middot; report written {escape(written)}</p>',
        "<nav>" + "".join(f'<a href="#{a}">{escape(t.lower())}</a>' for a, t in links) + "</nav>",
        _section("summary", "Summary", _summary(run)),
        *(_section(anchor, title, parts) for anchor, title, parts in present),
        '<h2 id="config">Config</h2>',
        f"<pre>{escape(config_text)}</pre>" if config_text else '<p class="absent">none</p>',
    ]
    if absent:
        body.append(f'<p class="absent">not in this run: {escape(", ".join(absent))}</p>')
    return page(f"{run.pipeline} - {run.path.name}", body)


def write_report(run_dir: str | Path | Run) -> Path:
    """Write `RUN_DIR/report.html` (of a run folder, or of a `Run` already read) and return
    its path."""
    run = run_dir if isinstance(run_dir, Run) else read_run(run_dir)
    output = run.path / "report.html"
    try:
        write_text_atomic(output, report_html(run))
    except OSError as error:
        problem = Problem("", f"report '{output}'", f"cannot be written: {error}")
        raise ConfigError([problem]) from error
    return output
