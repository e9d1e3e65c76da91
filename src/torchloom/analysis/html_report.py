"""`loom report RUN_DIR`: one self-contained HTML page about a run.

Everything the run left behind that helps to understand it goes on one page readable from a
file, without a server: summary and config, history curves, confusion matrices and per-class
tables, ROC curves, worst samples, sample grids, layer statistics, the model summary, viewer
images. Images are embedded as base64 data URIs; the page has inline CSS, no JavaScript and
no external URL. Every analysis file is optional: the page shows what exists. All text from
the run is escaped (a config value may contain anything).
"""

from __future__ import annotations

import base64
import html
import io
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from torchloom.analysis.run_reading import (
    Run,
    as_number,
    curve,
    format_number,
    markdown_blocks,
    plotted_statistics,
    read_csv,
    read_run,
)
from torchloom.analysis.skipped import read_skipped
from torchloom.data.atomic_files import write_text_atomic
from torchloom.errors import ConfigError, Problem

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_IMAGE_BYTES = 5_000_000  # larger files are named, not embedded: the page stays openable
MAX_IMAGES = 48  # per section
MAX_TABLE_ROWS = 200
CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1200px;
padding:1em 2em;color:#222;background:#fff;line-height:1.4}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:1px solid #ccc;margin-top:1.6em}
.meta{color:#666;font-size:.9em}nav a{margin-right:1em}.absent{color:#777;font-size:.9em}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f2f2f2}td.num{text-align:right;font-variant-numeric:tabular-nums}
td.best{background:#d9f2d9;font-weight:bold}
pre{background:#f7f7f7;border:1px solid #ddd;padding:.8em;overflow-x:auto;font-size:.85em}
figure{display:inline-block;margin:.4em;vertical-align:top;text-align:center}
figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:.8em;color:#555}
img.small{min-width:84px;image-rendering:pixelated}
.wide img{max-width:560px}.full figure{display:block}
.status-ok{color:#176117;font-weight:bold}.status-bad{color:#a31515;font-weight:bold}
"""
BAD_STATUSES = ("diverged", "interrupted", "running", "dead", "failed", "error", "unknown")


# ---- HTML building blocks (shared with compare.py) -----------------------------------------
def escape(text: object) -> str:
    return html.escape(str(text), quote=True)


def page(title: str, body: Iterable[str]) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    best: Sequence[set[int]] | None = None,
) -> str:
    """An HTML table; numbers are right-aligned; `best[i]` holds the highlighted columns of
    row i."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    lines = [f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>"]
    for index, row in enumerate(rows[:MAX_TABLE_ROWS]):
        cells = []
        for column, cell in enumerate(row):
            classes = []
            if isinstance(cell, int | float) and not isinstance(cell, bool):
                classes.append("num")
                cell = format_number(float(cell))
            if best and column in best[index]:
                classes.append("best")
            attribute = f' class="{" ".join(classes)}"' if classes else ""
            cells.append(f"<td{attribute}>{escape(cell)}</td>")
        lines.append(f"<tr>{''.join(cells)}</tr>")
    lines.append("</tbody>\n</table>")
    if len(rows) > MAX_TABLE_ROWS:
        lines.append(f'<p class="absent">{len(rows) - MAX_TABLE_ROWS} more rows not shown</p>')
    return "\n".join(lines)


def png_tag(data: bytes, alt: str) -> str:
    encoded = base64.b64encode(data).decode("ascii")
    # Tiny images (a 28x28 digit) are shown three times larger, pixels kept sharp.
    small = ' class="small"' if int.from_bytes(data[16:20], "big") < 84 else ""
    return f'<img src="data:image/png;base64,{encoded}" alt="{escape(alt)}"{small}>'


def figure(data: bytes, caption: str, show_caption: bool = True) -> str:
    text = f"<figcaption>{escape(caption)}</figcaption>" if show_caption else ""
    return f"<figure>{png_tag(data, caption)}{text}</figure>"


def png_file_figure(path: Path, caption: str | None = None) -> str:
    """A PNG file embedded with a caption; a note naming it when it is too big or no PNG."""
    try:
        size = path.stat().st_size
        data = path.read_bytes()[:8] if size > MAX_IMAGE_BYTES else path.read_bytes()
    except OSError as error:
        return f'<p class="absent">{escape(path.name)}: cannot be read ({escape(error)})</p>'
    problem = "not a PNG file" if not data.startswith(PNG_SIGNATURE) else ""
    problem = f"{size} bytes, too big to embed" if size > MAX_IMAGE_BYTES else problem
    if problem:
        return f'<p class="absent">{escape(path.name)}: {problem}</p>'
    return figure(data, caption if caption is not None else path.stem)


def gallery(paths: Sequence[Path], css_class: str = "gallery") -> str:
    """PNG files side by side (`wide`: at most 560 pixels wide; `full`: one per line)."""
    if not paths:
        return ""
    parts = [png_file_figure(p) for p in paths[:MAX_IMAGES]]
    if len(paths) > MAX_IMAGES:
        parts.append(f'<p class="absent">{len(paths) - MAX_IMAGES} more images not shown</p>')
    return f'<div class="{css_class}">' + "\n".join(parts) + "</div>"


def markdown_html(text: str) -> str:
    """The analysis reports' markdown as HTML: headings, pipe tables, lists, code, text."""
    parts = []
    for kind, value in markdown_blocks(text):
        if kind == "heading":
            level = min(int(value[0]) + 2, 6)  # below the page's own h1/h2
            parts.append(f"<h{level}>{_inline(value[1])}</h{level}>")
        elif kind == "table" and value:
            header, *rows = value
            head = "".join(f"<th>{_inline(c)}</th>" for c in header)
            body = "".join("<tr>" + "".join(map(_cell, row)) + "</tr>" for row in rows)
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif kind == "list":
            parts.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in value) + "</ul>")
        elif kind == "code":
            parts.append(f"<pre>{escape(value)}</pre>")
        elif kind == "paragraph":
            parts.append(f"<p>{_inline(value)}</p>")
    return "\n".join(parts)


def _cell(text: str) -> str:
    numeric = re.fullmatch(r"[-+]?(\d[\d,]*)?\.?\d+(e[-+]?\d+)?%?|nan|inf", text.lower())
    return f'<td class="num">{_inline(text)}</td>' if numeric else f"<td>{_inline(text)}</td>"


def _inline(text: str) -> str:
    escaped = escape(text)
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped)


def csv_table(path: Path, rows: Sequence[dict[str, str]] | None = None) -> str:
    """A CSV file (or some of its rows) as a table, numbers formatted and right-aligned."""
    rows = read_csv(path) if rows is None else rows
    if not rows:
        return f'<p class="absent">{escape(path.name)} is empty</p>'
    headers = list(rows[0])
    cells = [[_number_or_text(r.get(h) or "") for h in headers] for r in rows]
    return table(headers, cells)


def _number_or_text(text: str) -> float | str:
    number = as_number(text)
    return text if number is None else number


# ---- plots ---------------------------------------------------------------------------------
def new_figure(width: float = 5.5, height: float = 3.5) -> Figure:
    """A matplotlib figure drawn with Agg, without pyplot's global state."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    result = Figure(figsize=(width, height), dpi=90)
    FigureCanvasAgg(result)
    return result


def figure_png(result: Figure) -> bytes:
    buffer = io.BytesIO()
    result.tight_layout()
    result.savefig(buffer, format="png")
    return buffer.getvalue()


def line_plot(
    title: str,
    series: Sequence[tuple[str, list[float], list[float]]],
    x_label: str = "episode",
    legend: bool = False,
) -> bytes:
    """One statistic: a line per (label, x, y) against epochs or episodes (integer ticks);
    single points as markers."""
    from matplotlib.ticker import MaxNLocator

    drawing = new_figure()
    axes = drawing.add_subplot()
    for label, xs, ys in series:
        style = "o" if len(xs) == 1 else "-o"
        axes.plot(xs, ys, style, label=label, markersize=3 if len(xs) > 30 else 5)
    axes.set_title(title)
    axes.set_xlabel(x_label)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(alpha=0.3)
    if legend or len(series) > 1:
        axes.legend(fontsize="small")
    return figure_png(drawing)


def history_plots(run: Run, skip_lr: bool = False) -> list[tuple[str, bytes]]:
    """(statistic, PNG) per statistic: one line per split against the episode, and the
    training rows at the logging interval where there are any."""
    history = run.history()
    columns = {column for rows in history.values() for row in rows for column in row}
    named_rows = [("training (interval)", run.interval_history()), *history.items()]
    plots = []
    for statistic in plotted_statistics(columns - ({"lr"} if skip_lr else set())):
        series = [(name, *curve(rows, "episode", statistic)) for name, rows in named_rows]
        series = [line for line in series if line[1]]
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
    if not pngs:  # no history analysis: our own curves from the statistics CSVs
        plots = history_plots(run, skip_lr=bool(lr))
        parts = [figure(data, name, show_caption=False) for name, data in plots]
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
            errors = read_csv(found["-errors.csv"])
            parts.append(f"<p>{len(errors)} prediction errors (the first 20):</p>")
            parts.append(csv_table(found["-errors.csv"], errors[:20]) if errors else "")
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
    rows = read_csv(paths[0]) if paths else []
    if not rows:
        return []
    headers = list(rows[0])
    key = next((h for h in ("layer", "name", "module") if h in headers), None)
    if key is None:  # one column per layer statistic: the last row, one value per line
        last = [{"column": k, "last value": v or ""} for k, v in rows[-1].items()]
        content = csv_table(paths[0], last)
    else:  # one row per layer and measurement: the last measurement of each layer
        content = csv_table(paths[0], list({row.get(key, ""): row for row in rows}.values()))
    return [f"<p>last measurement per layer, from {escape(paths[0].name)}</p>", content]


def _skipped(run: Run) -> list[str]:
    """The items that were on but did not run, one row per reason (reports/skipped.json)."""
    by_reason: dict[str, list[str]] = {}
    for item, why in read_skipped(run.path).items():
        by_reason.setdefault(why, []).append(item)
    rows = [[", ".join(items), why] for why, items in by_reason.items()]
    return [table(["item (on, but did not run)", "why"], rows)] if rows else []


def _markdown_file(path: Path) -> str:
    return markdown_html(path.read_text(encoding="utf-8", errors="replace"))


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
    config_text = run.config_text()
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


def write_report(run_dir: str | Path) -> Path:
    """Write `RUN_DIR/report.html` and return its path."""
    run = read_run(run_dir)
    output = run.path / "report.html"
    try:
        write_text_atomic(output, report_html(run))
    except OSError as error:
        problem = Problem("", f"report '{output}'", f"cannot be written: {error}")
        raise ConfigError([problem]) from error
    return output
