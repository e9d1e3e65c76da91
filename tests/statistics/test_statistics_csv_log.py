"""CsvLog on a long run's files: cut and read back a row at a time (a resume read every row of
every file as dicts: 7.8 s and 755 MB for a million rows), and a file that cannot be read as
one is a StorageError naming it, not a traceback."""

from __future__ import annotations

import csv
import tracemalloc
from pathlib import Path

import pytest

from torchloom.errors import StorageError
from torchloom.statistics.csv_log import CsvLog

COLUMNS = ["episode", "epoch", "loss", "accuracy"]


def long_file(path: Path, rows: int) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        writer.writerows([i, i // 100, f"{1 / i:.8g}", "0.5"] for i in range(1, rows + 1))
    return path


def test_a_resume_cuts_a_long_file_a_row_at_a_time(tmp_path: Path) -> None:
    path = long_file(tmp_path / "training_statistics.csv", 50_000)
    whole = path.read_bytes()
    tracemalloc.start()
    try:
        log = CsvLog(path, keep_rows=49_990)  # rows a killed run wrote after its checkpoint
        at = log.rows(49_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2_000_000, f"{peak:,} bytes held"  # the rows as dicts: 40 MB
    assert log.count == 49_990 and log.columns == COLUMNS
    assert whole.startswith(path.read_bytes())  # the rows kept, byte for byte
    assert path.read_bytes().count(b"\n") == 49_991
    assert at == [{"episode": "49000", "epoch": "490", "loss": "2.0408163e-05", "accuracy": "0.5"}]


def test_a_new_column_extends_every_row_and_a_cut_keeps_the_rows_up_to_an_episode(
    tmp_path: Path,
) -> None:
    path = tmp_path / "stats.csv"
    # a quoted cell over two lines, a row with a cell of no column, a last row cut short
    path.write_text('episode,note\r\n1,"two\r\nlines"\r\n2,x,extra\r\n3', encoding="utf-8")
    log = CsvLog(path, keep_until_episode=2)
    assert log.count == 2 and log.rows() == [
        {"episode": "1", "note": "two\r\nlines"},
        {"episode": "2", "note": "x"},
    ]
    log.write({"episode": 3, "note": "y", "loss": 0.5})  # a new column
    assert CsvLog(path).rows() == [
        {"episode": "1", "note": "two\r\nlines", "loss": ""},
        {"episode": "2", "note": "x", "loss": ""},  # not "extra": it was under no column
        {"episode": "3", "note": "y", "loss": "0.5"},
    ]


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (b"\xff\xfe garbage\r\n", "'utf-8' codec can't decode byte 0xff"),
        (b'4,"' + b"9" * 200_000 + b'"\r\n', "field larger than field limit"),
        (b"four,0,0.1,0.5\r\n", "a row's episode is 'four', not a number"),
        (b"inf,0,0.1,0.5\r\n", "a row's episode is 'inf', not a number"),
    ],
    ids=["not-utf-8", "huge-cell", "episode-no-number", "episode-infinite"],
)
def test_a_damaged_file_is_a_storage_error_that_names_it(
    tmp_path: Path, damage: bytes, reason: str
) -> None:
    path = long_file(tmp_path / "training_statistics.csv", 3)
    path.write_bytes(path.read_bytes() + damage)
    before = path.read_bytes()
    with pytest.raises(StorageError) as raised:
        CsvLog(path, keep_until_episode=2)
    message = str(raised.value)
    assert f"'{path}': cannot be read as a statistics file: {reason}" in message, message
    assert "move it out of the run folder" in message
    assert path.read_bytes() == before  # nothing cut or rewritten


def test_rows_written_after_an_empty_file_or_a_last_line_without_a_break_stand_alone(
    tmp_path: Path,
) -> None:
    """An empty file got rows without a header; a row appended to a last line without a line
    break ran into it ("1,2" then "2,3" became "1,22,3")."""
    empty = tmp_path / "empty.csv"
    empty.touch()
    CsvLog(empty).write({"episode": 1, "loss": 0.5})
    assert CsvLog(empty).rows() == [{"episode": "1", "loss": "0.5"}]
    unended = tmp_path / "unended.csv"
    unended.write_text("episode,loss\r\n1,2", encoding="utf-8")
    CsvLog(unended, keep_rows=1).write({"episode": 2, "loss": 3})
    assert CsvLog(unended).rows() == [
        {"episode": "1", "loss": "2"},
        {"episode": "2", "loss": "3"},
    ]
