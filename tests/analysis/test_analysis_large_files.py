"""A run folder from someone else may hold files of any size: `loom report`, `loom runs` and
`loom compare` read at most what such a file holds when torchloom writes it, and say so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memory_peak import traced_peak
from torchloom.analysis.compare import config_differences
from torchloom.analysis.html_parts import MAX_IMAGE_BYTES, png_file_figure
from torchloom.analysis.html_report import report_html
from torchloom.analysis.run_reading import MAX_SUMMARY_BYTES, read_run, read_run_or_unreadable
from torchloom.analysis.skipped import read_skipped
from torchloom.errors import ConfigError


def small_run(folder: Path, name: str = "run") -> Path:
    run = folder / name
    (run / "reports").mkdir(parents=True)
    (run / "summary.json").write_text('{"status": "epoch_limit"}', encoding="utf-8")
    (run / "config.yaml").write_text("training:\n  seed: 1\n", encoding="utf-8")
    return run


def test_a_summary_larger_than_a_run_writes_is_refused_unread(tmp_path: Path) -> None:
    run = small_run(tmp_path)
    padding = " " * (MAX_SUMMARY_BYTES + 10)
    (run / "summary.json").write_text('{"status": "epoch_limit"' + padding + "}", "utf-8")
    with traced_peak() as peak, pytest.raises(ConfigError, match=r"16,000,035 bytes"):
        read_run(run)
    assert peak[0] < 1e6  # not read at all
    assert read_run_or_unreadable(run).status == "unreadable"  # `loom runs` lists it so


def test_long_report_files_are_shown_in_part(tmp_path: Path) -> None:
    """config.yaml past the config limit (256 KiB), a markdown report of 3 MB: the page
    shows their heads and says how long they are; `loom compare` does not parse a cut
    config as if it were whole."""
    run = small_run(tmp_path)
    (run / "config.yaml").write_text("training:\n  seed: 1\n" + "# x\n" * 500_000, "utf-8")
    (run / "reports" / "model_summary.md").write_text("| layer |\n" * 300_000, "utf-8")
    page = report_html(read_run(run))
    assert "(cut: config.yaml has 2,000,020 bytes, more than a config)" in page
    assert "model_summary.md: the first 1,000,000 of 3,000,000 bytes" in page
    assert len(page) < 3_000_000
    other = small_run(tmp_path, "other")
    differences = config_differences([read_run(run), read_run(other)])
    unread = "(cannot be read: has 2,000,020 bytes, more than a config)"
    assert ["config.yaml", unread, "(absent)"] in differences


def test_an_image_too_big_to_embed_is_not_read(tmp_path: Path) -> None:
    image = tmp_path / "big.png"
    image.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(MAX_IMAGE_BYTES + 1))
    with traced_peak() as peak:
        shown = png_file_figure(image)
    assert "too big to embed" in shown and peak[0] < 1e6


def test_a_skipped_list_larger_than_written_is_read_as_none(tmp_path: Path) -> None:
    run = small_run(tmp_path)
    skipped = {f"item{i}": "why " * 100 for i in range(3000)}
    (run / "reports" / "skipped.json").write_text(json.dumps(skipped), encoding="utf-8")
    assert read_skipped(run) == {}
    (run / "reports" / "skipped.json").write_text('{"roc": "no probabilities"}', "utf-8")
    assert read_skipped(run) == {"roc": "no probabilities"}
