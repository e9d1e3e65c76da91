"""CSV cells of user text (class names, a search's values, exported streams) that a
spreadsheet would run as formulas are written as text; numbers stay numbers."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from torchloom.analysis.classification import _write_csv
from torchloom.analysis.prediction_errors import error_line
from torchloom.data.csv_cells import safe_cell


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ('=HYPERLINK("evil.example","x")', '\'=HYPERLINK("evil.example","x")'),
        ("+cmd", "'+cmd"),
        ("-x", "'-x"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\tx", "'\tx"),
        ("-0.5", "-0.5"),
        ("+3", "+3"),
        ("1e-3", "1e-3"),
        ("cat", "cat"),
        (-2, -2),
        (0.25, 0.25),
    ],
)
def test_a_cell_a_spreadsheet_would_run_is_text(value: object, written: object) -> None:
    assert safe_cell(value) == written


def test_the_confusion_matrix_and_the_errors_write_class_names_as_text(tmp_path: Path) -> None:
    """A dataset whose class folder is named `=HYPERLINK(...)` put a live formula in
    `-cm.csv` and `-errors.csv` (an ImageFolder takes any folder name but a hidden one)."""
    names = ["cat", '=HYPERLINK("evil.example","x")']
    _write_csv(tmp_path / "cm.csv", [["", *names], [names[1], 1, 0]])
    rows = list(csv.reader((tmp_path / "cm.csv").open(newline="")))
    assert rows[0][2] == rows[1][0] == "'" + names[1]
    assert error_line(3, 0, 1, 0.9, names)[5] == "'" + names[1]
