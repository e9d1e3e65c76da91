"""Plain-text tables for the terminal (no dependency: the output is a few dozen rows)."""

from __future__ import annotations

from collections.abc import Sequence


def format_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], align_right: set[int] | None = None
) -> str:
    align_right = align_right or set()
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(str(cell))) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            str(cell).rjust(width) if i in align_right else str(cell).ljust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    separator = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), separator, *(line(r) for r in rows)])
