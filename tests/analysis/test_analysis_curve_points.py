"""Curves of a statistics CSV in bounded memory: every point of a short run, each stretch's
lowest and highest of a long one (a spike stays), and a long file read a row at a time by
the history plots and `loom report`."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from pathlib import Path

import pytest

from memory_peak import traced_peak
from torchloom.analysis.curve_points import (
    MAX_BUCKETS,
    Curves,
    Envelope,
    FollowedCurves,
    read_curves,
)
from torchloom.analysis.history import HistoryReader, draw_history, history_series
from torchloom.analysis.html_report import history_plots, report_html
from torchloom.analysis.plotting import png_data
from torchloom.analysis.run_reading import read_run
from torchloom.statistics.csv_log import CsvLog


def test_an_envelope_keeps_every_point_while_there_are_few() -> None:
    envelope = Envelope(limit=8)
    points = [(float(x), math.sin(x)) for x in range(8)]
    for x, y in points:
        envelope.add(x, y)
    assert envelope.points() == ([p[0] for p in points], [p[1] for p in points])


def test_a_long_curve_keeps_each_stretchs_extremes_in_bounded_points() -> None:
    rows = 100_000
    generator = random.Random(4)
    ys = [generator.gauss(0.0, 1.0) for _ in range(rows)]
    ys[31_337] = 50.0  # one spike, and one dip, among the noise
    ys[77_001] = -50.0
    envelope = Envelope(limit=100)
    for x, y in enumerate(ys):
        envelope.add(float(x), y)
    xs, kept = envelope.points()
    assert len(xs) <= 202 and len(envelope.buckets) <= 100
    assert xs == sorted(xs) and (xs[0], xs[-1]) == (0.0, rows - 1)  # the whole run, in order
    assert max(kept) == 50.0 and min(kept) == -50.0
    assert all(ys[int(x)] == y for x, y in zip(xs, kept, strict=True))  # the file's own points
    # Each stretch of rows_per_bucket rows has its lowest and highest value drawn.
    width = envelope.rows_per_bucket
    for start in range(0, rows, width):
        stretch = ys[start : start + width]
        assert max(stretch) in kept and min(stretch) in kept


def long_run(folder: Path, rows: int) -> Path:
    """A run folder whose interval statistics hold `rows` rows (a long run, or a file
    received from someone else), with one spike of its loss."""
    header = "episode,epoch,loss,loss_std,accuracy,batch_size\n"
    with open(folder / "training_statistics.csv", "w", encoding="utf-8") as out:
        out.write(header)
        for episode in range(1, rows + 1):
            loss = 9.0 if episode == rows // 3 else 1.0 / episode**0.5
            out.write(f"{episode},{episode // 1000 + 1},{loss:.6f},0.1,0.5,64\n")
    (folder / "training_epoch_statistics.csv").write_text(
        "epoch,episode,loss,accuracy\n1,1000,0.5,0.4\n2,2000,0.4,0.5\n", encoding="utf-8"
    )
    (folder / "summary.json").write_text('{"status": "epoch_limit"}', encoding="utf-8")
    return folder


def test_a_long_statistics_file_is_drawn_in_bounded_memory(tmp_path: Path) -> None:
    """40,000 rows: read as dicts, 28 MB and every point into the PNG's own data (a
    million rows took 2.2 GB and 40 s of `loom report`); now a few MB, each curve at most
    twice MAX_BUCKETS points (and its first and last), the spike among them."""
    run = long_run(tmp_path, 40_000)
    with traced_peak() as peak:
        series = history_series(run)
    assert peak[0] < 5e6, f"{peak[0] / 1e6:.0f} MB"  # 28 MB before, 0.8 MB now
    xs, ys = series["loss"]["per interval"]["training"]
    assert 1000 < len(xs) <= 2 * MAX_BUCKETS + 2 and max(ys) == 9.0
    assert (xs[0], xs[-1]) == (1.0, 40_000.0)
    assert series["loss"]["per epoch"]["training"] == ([1.0, 2.0], [0.5, 0.4])  # all of few
    draw_history(run)
    drawn = png_data(run / "reports" / "history" / "loss.png")["panels"]["per interval"]
    assert len(drawn["training"][0]) <= 2 * MAX_BUCKETS + 2 and max(drawn["training"][1]) == 9.0
    # `loom report` reads the same file the same way.
    curves = read_run(run).interval_curves()
    assert curves["loss"] == (xs, ys)
    assert [name for name, _ in history_plots(read_run(run))] == ["accuracy", "loss"]


def test_an_unreadable_or_missing_file_has_no_curves(tmp_path: Path) -> None:
    (tmp_path / "bad.csv").write_bytes(b"episode,loss\n1,0.5\n2,\xff\xfe\n3,0.25\n")
    assert read_curves(tmp_path / "bad.csv", "episode") == {"loss": ([1.0, 3.0], [0.5, 0.25])}
    assert read_curves(tmp_path / "missing.csv", "episode") == {}
    (tmp_path / "nan.csv").write_text("episode,loss,name\n1,nan,a\n2,inf,b\n", encoding="utf-8")
    assert read_curves(tmp_path / "nan.csv", "episode") == {}
    # The last row, which the history plots compare with the row not yet written, is the
    # file's last row of data, blank lines after it or not.
    (tmp_path / "blank.csv").write_text("episode,loss\n1,0.5\n3,0.25\n\n\n", encoding="utf-8")
    assert Curves("episode").read(tmp_path / "blank.csv").last_row == {
        "episode": "3",
        "loss": "0.25",
    }


def test_the_report_shows_the_head_of_long_report_files(tmp_path: Path) -> None:
    """A report file of a long run (or of a folder from someone else) is read a row at a
    time: the errors counted and their first 20 shown, a table's first TABLE_ROWS rows said
    to be so, and the last measurement of each layer."""
    run = long_run(tmp_path, 10)
    reports = run / "reports"
    (reports / "worst_samples").mkdir(parents=True)
    errors = "".join(f"{i},{i % 3},{(i + 1) % 3}\n" for i in range(5000))
    (reports / "predictions-validation-errors.csv").write_text(
        "position,target,prediction\n" + errors, encoding="utf-8"
    )
    worst = "".join(f"{i},{1.0 / (i + 1):.5f}\n" for i in range(3000))
    (reports / "worst_samples" / "worst.csv").write_text("sample,loss\n" + worst, "utf-8")
    layers = "".join(f"{step},layer{k},{step * 10 + k}\n" for step in range(3000) for k in range(4))
    (reports / "layer_statistics.csv").write_text(
        "episode,layer,gradient_norm\n" + layers, encoding="utf-8"
    )
    page = report_html(read_run(run))
    assert "5000 prediction errors (the first 20)" in page
    assert "the first 1,000 of 3,000 rows of worst.csv" in page
    last = [f'layer{k}</td><td class="num">{29990 + k:,}' for k in range(4)]
    start = page.index("last measurement per layer")
    layer_part = page[start : page.index("</table>", start)]
    assert all(cell.replace(",", "") in layer_part.replace(",", "") for cell in last)
    assert layer_part.count("<tr>") == 5  # the header and the four layers


def test_a_growing_file_is_followed_a_row_once(tmp_path: Path) -> None:
    """What the history plots read after each epoch: the rows added since, not the whole file
    again; a line still being written waits; a file rewritten with a new column, or cut, is
    read again from its start; at every step the same curves as the file read whole."""
    path = tmp_path / "training_statistics.csv"
    log = CsvLog(path)
    followed = FollowedCurves(path, "episode")
    fed: list[int] = []
    feed = Curves.feed

    def counted(self: Curves, reader: Iterable[list[str]]) -> None:
        rows = list(reader)
        fed.append(len(rows))
        feed(self, rows)

    def same_as_whole() -> None:
        curves = followed.update()
        whole = Curves("episode").read(path)
        assert curves.points() == whole.points() and curves.last_row == whole.last_row

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Curves, "feed", counted)
        assert followed.update().points() == {}  # no file yet
        for episode in range(1, 41):
            log.write({"episode": episode, "loss": 1.0 / episode})
            if episode % 10 == 0:
                fed.clear()
                same_as_whole()
                assert fed[0] == 10  # the 10 rows written since, not the 10 * k of the file
        with open(path, "a", encoding="utf-8") as out:
            out.write("41,0.0")  # half a row: the engine is writing it
        fed.clear()
        assert followed.update().points()["loss"][0][-1] == 40.0 and fed == [0]
        with open(path, "a", encoding="utf-8") as out:
            out.write("25\r\n")
        assert followed.update().points()["loss"][1][-1] == 0.025
        log.write({"episode": 42, "loss": 0.5, "accuracy": 0.75})  # a new column: rewritten
        same_as_whole()
        assert followed.curves.points()["accuracy"] == ([42.0], [0.75])
        CsvLog(path, keep_until_episode=20)  # cut back, as a resume does
        same_as_whole()
        assert followed.curves.points()["loss"][0][-1] == 20.0
        # Deleted and written again with the same header (a new file may get the old one's
        # inode number): not read on from the old offset.
        path.unlink()
        log = CsvLog(path)
        for episode in range(100, 130):
            log.write({"episode": episode, "loss": 2.0, "accuracy": 0.5})
        same_as_whole()
        assert followed.curves.points()["loss"][0][0] == 100.0
    path.unlink()
    assert followed.update().points() == {}


def test_the_history_of_a_run_is_read_as_it_grows(tmp_path: Path) -> None:
    """HistoryReader (the history hook's) against history_series (a whole read), with a
    pending row, epoch after epoch."""
    reader = HistoryReader(tmp_path)
    epochs = CsvLog(tmp_path / "training_epoch_statistics.csv")
    intervals = CsvLog(tmp_path / "training_statistics.csv")
    for epoch in range(1, 6):
        for step in range(1, 4):
            episode = 3 * (epoch - 1) + step
            intervals.write({"epoch": epoch, "episode": episode, "loss": 1.0 / episode})
        row = {"epoch": epoch, "episode": 3 * epoch, "loss": 0.5**epoch}  # exact in the file
        pending = {("per epoch", "training"): row}
        expected = (
            [float(e) for e in range(1, epoch + 1)],
            [0.5**e for e in range(1, epoch + 1)],
        )
        series = reader.series(pending)
        assert series == history_series(tmp_path, pending)
        assert series["loss"]["per epoch"]["training"] == expected  # the pending row last
        epochs.write(row)
        series = reader.series(pending)
        assert series == history_series(tmp_path, pending)
        assert series["loss"]["per epoch"]["training"] == expected  # not twice
    assert reader.series()["loss"]["per interval"]["training"][0] == list(range(1, 16))
