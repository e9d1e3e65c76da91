"""Building blocks of torchloom's self-contained HTML pages (`loom report`, `loom compare`,
a search's page): escaping, the page with its inline CSS, tables, PNG images embedded as
data URIs, the analysis reports' markdown, and line plots drawn with matplotlib's Agg
canvas. No JavaScript, no external URL; every text is escaped (a config value may contain
anything).
"""

from __future__ import annotations

import base64
import html
import io
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from torchloom.analysis.file_heads import read_csv_head
from torchloom.analysis.run_reading import as_number, format_number, markdown_blocks

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
        with open(path, "rb") as handle:  # a file too big to embed: only its signature
            size = os.fstat(handle.fileno()).st_size
            data = handle.read(8 if size > MAX_IMAGE_BYTES else size)
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


# Rows a table of the report shows at most: a report file of a long run, or of a folder received
# from someone else, may hold millions.
TABLE_ROWS = 1000


def _cell(text: str) -> str:
    numeric = re.fullmatch(r"[-+]?(\d[\d,]*)?\.?\d+(e[-+]?\d+)?%?|nan|inf", text.lower())
    return f'<td class="num">{_inline(text)}</td>' if numeric else f"<td>{_inline(text)}</td>"


def _inline(text: str) -> str:
    escaped = escape(text)
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped)


def csv_table(path: Path, rows: Sequence[dict[str, str]] | None = None) -> str:
    """A CSV file (its first TABLE_ROWS rows, saying so when it has more; or some of its
    rows) as a table, numbers formatted and right-aligned."""
    note = ""
    if rows is None:
        rows, total = read_csv_head(path, TABLE_ROWS)
        if total > len(rows):
            note = f"<p>the first {len(rows):,} of {total:,} rows of {escape(path.name)}</p>"
    if not rows:
        return f'<p class="absent">{escape(path.name)} is empty</p>'
    headers = list(rows[0])
    cells = [[_number_or_text(r.get(h) or "") for h in headers] for r in rows]
    return note + table(headers, cells)


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
