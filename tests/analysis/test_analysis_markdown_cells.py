"""Text from the data (class names, labels) stays in its markdown table cell."""

from __future__ import annotations


def test_a_class_name_on_two_lines_stays_in_its_markdown_cell() -> None:
    """A class folder named "nl\\n# Injected heading" broke the classification report's table
    and made a heading of its own (report.html showed it as one)."""
    import numpy as np

    from torchloom.analysis.classification_numbers import classification_report, report_markdown

    names = ["cat", "nl\n# Injected heading"]
    matrix = np.array([[3, 1], [2, 4]])
    text = report_markdown("report", classification_report(matrix, names), [])
    assert not any(line.startswith("# Injected") for line in text.splitlines())
    assert "| nl # Injected heading |" in text
