"""CSV cells that a spreadsheet will not run as formulas.

The CSV files a run writes hold text from its inputs: class names read from a dataset's
folders or label files, a search's parameter values, exported streams. A spreadsheet that
opens one runs a cell starting with `=`, `+`, `-` or `@` as a formula (`=HYPERLINK(...)`);
such a cell is written behind a `'`, which spreadsheets show as text (OWASP's advice for CSV
injection). Numbers, also written as text (`-0.5`), are left as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(value: Any) -> Any:
    """`value`, or a string a spreadsheet would run as a formula behind a `'`."""
    if not isinstance(value, str) or not value.startswith(FORMULA_STARTS):
        return value
    try:
        float(value)
    except ValueError:
        return "'" + value
    return value  # a number


def safe_cells(row: Iterable[Any]) -> list[Any]:
    return [safe_cell(value) for value in row]


def safe_mapping(row: Mapping[str, Any]) -> dict[str, Any]:
    return {key: safe_cell(value) for key, value in row.items()}
