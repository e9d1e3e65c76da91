"""`loom compare RUN_A RUN_B ...`: two real tiny runs side by side on one page."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
from argparse import Namespace
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image, ImageStat

import torchloom
from torchloom.analysis.compare import config_differences, write_comparison
from torchloom.analysis.run_reading import read_run
from torchloom.cli import compare as compare_command
from torchloom.errors import ConfigError

SMALL_RUN = """\
default_configs: [loom://mnist/lenet5.yml]
training:
  task: {{data_folder: {data}, subset: 128}}
  dataloader: {{batch_size: 64}}
  terminal_conditions: {{epoch_limit: 2}}
validation:
  task: {{subset: 64}}
test:
  task: {{subset: 64}}
"""


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("compare")
    config = folder / "small.yml"
    config.write_text(SMALL_RUN.format(data=folder / "mnist"), encoding="utf-8")
    expdir = str(folder / "runs")
    return [
        torchloom.train(
            config, [f"training.optimizer.lr={lr}"], expdir=expdir, analysis=False, tensorboard=0
        ).run_dir
        for lr in ("0.001", "0.01")
    ]


@pytest.fixture(scope="module")
def page(two_runs: list[Path], tmp_path_factory: pytest.TempPathFactory) -> str:
    output = tmp_path_factory.mktemp("page") / "compare.html"
    return write_comparison(two_runs, output).read_text(encoding="utf-8")


class Tables(HTMLParser):
    """Cell texts of every table, whether each cell is highlighted, and the images."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tables: list[list[list[tuple[str, bool]]]] = []
        self.images: list[dict[str, str]] = []
        self._cell: list[str] | None = None
        self._best = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        if tag == "img":
            self.images.append(values)
        elif tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell, self._best = [], "best" in values.get("class", "")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append(("".join(self._cell).strip(), self._best))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def row(self, table: int, name: str) -> list[tuple[str, bool]]:
        return next(r for r in self.tables[table] if r and r[0][0] == name)


def test_compare_puts_both_runs_side_by_side(two_runs: list[Path], page: str) -> None:
    text, tables = page, Tables(page)
    header = [cell for cell, _ in tables.tables[0][0]]
    labels = [f"{run.parent.name}/{run.name}" for run in two_runs]
    assert header == ["", *labels]
    summaries = [json.loads((run / "summary.json").read_text()) for run in two_runs]
    accuracy = tables.row(0, "test.accuracy")
    values = [float(cell) for cell, _ in accuracy[1:]]
    expected = [s["final"]["test"]["accuracy"] for s in summaries]
    assert values == pytest.approx(expected, abs=5e-5)
    highlighted = [best for _, best in accuracy[1:]]
    if expected[0] != expected[1]:
        assert highlighted == [expected[0] > expected[1], expected[1] > expected[0]]
    loss_row = tables.row(0, "validation.loss")[1:]
    losses = [float(cell) for cell, _ in loss_row]
    if losses[0] != losses[1]:
        lowest = [losses[0] < losses[1], losses[1] < losses[0]]
        assert [best for _, best in loss_row] == lowest, "a lower loss is better"
    assert tables.row(0, "status")[1:] == [("epoch_limit", False), ("epoch_limit", False)]
    assert not re.search(r"\b(?:src|href)=\"(?!data:|#)", text) and "<script" not in text


def test_history_curves_are_overlaid_one_plot_per_statistic(page: str) -> None:
    plots = {image["alt"]: image["src"] for image in Tables(page).images}
    assert {"training.loss", "validation.loss", "validation.accuracy"} <= set(plots)
    for name, source in plots.items():
        assert source.startswith("data:image/png;base64,"), name
        picture = Image.open(io.BytesIO(base64.b64decode(source.split(",", 1)[1])))
        assert picture.format == "PNG"
        assert ImageStat.Stat(picture.convert("L")).stddev[0] > 5, f"{name} is blank"


def test_the_config_diff_shows_the_keys_that_differ(two_runs: list[Path], page: str) -> None:
    differences = {row[0]: row[1:] for row in config_differences([read_run(r) for r in two_runs])}
    assert differences["training.optimizer.lr"] == ["0.001", "0.01"]
    assert "pipeline.image_classifier.type" not in differences
    row = Tables(page).row(-1, "training.optimizer.lr")
    assert [cell for cell, _ in row] == ["training.optimizer.lr", "0.001", "0.01"]


def test_an_existing_page_is_kept_unless_forced(
    two_runs: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the default output is ./compare.html
    page = tmp_path / "compare.html"
    page.write_text("earlier results", encoding="utf-8")
    arguments = Namespace(run_dirs=[str(r) for r in two_runs], output="compare.html", force=False)
    with pytest.raises(ConfigError, match="--force"):
        compare_command.run(arguments)
    assert page.read_text(encoding="utf-8") == "earlier results"
    arguments.force = True
    assert compare_command.run(arguments) == 0
    assert page.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_bad_input_writes_nothing(two_runs: list[Path], tmp_path: Path) -> None:
    output = tmp_path / "compare.html"
    with pytest.raises(ConfigError, match="does not exist"):
        write_comparison([two_runs[0], tmp_path / "nowhere"], output, force=True)
    with pytest.raises(ConfigError, match="at least two"):
        write_comparison([two_runs[0]], output)
    with pytest.raises(ConfigError, match="is a folder"):
        write_comparison(two_runs, tmp_path)
    assert not output.exists()
    # -o RUN/summary.json --force made the run's summary an HTML page.
    summary = two_runs[0] / "summary.json"
    kept = summary.read_bytes()
    with pytest.raises(ConfigError, match=r"is not an \.html file"):
        write_comparison(two_runs, summary, force=True)
    assert summary.read_bytes() == kept
    with pytest.raises(ConfigError, match="cannot be a file name: it is longer than 255"):
        write_comparison(two_runs, tmp_path / ("x" * 300 + ".html"))
    # -o RUN/report.html --force replaced a compared run's own report.
    report = two_runs[1] / "report.html"
    report.write_text("the run's report")
    with pytest.raises(ConfigError, match="is a file of the compared run folder"):
        write_comparison(two_runs, report, force=True)
    assert report.read_text() == "the run's report"


def _copy_with_summary(run: Path, folder: Path, best: float, final: float) -> Path:
    copy = folder / run.name
    shutil.copytree(run, copy)
    summary = json.loads((copy / "summary.json").read_text())
    summary["best"]["validation.accuracy"] = best
    summary["final"]["validation"]["accuracy"] = final
    (copy / "summary.json").write_text(json.dumps(summary))
    return copy


def test_runs_are_ranked_by_their_best_evaluation_as_loom_runs_ranks_them(
    two_runs: list[Path], tmp_path: Path
) -> None:
    """compare ranked the last epoch's values while `loom runs` (and the docs) rank the best
    evaluation's: run A, best 0.8672 and last 0.8438, tied with run B's 0.8438 unmarked."""
    a = _copy_with_summary(two_runs[0], tmp_path / "a", best=0.8672, final=0.8438)
    b = _copy_with_summary(two_runs[1], tmp_path / "b", best=0.8438, final=0.8438)
    tables = Tables(write_comparison([a, b], tmp_path / "c.html").read_text(encoding="utf-8"))
    assert tables.row(0, "validation.accuracy")[1:] == [("0.8672", True), ("0.8438", False)]
    last = tables.row(0, "validation.accuracy (last epoch)")[1:]
    assert [cell for cell, _ in last] == ["0.8438", "0.8438"] and not any(b for _, b in last)


def test_a_config_that_would_take_unbounded_memory_is_not_read(
    two_runs: list[Path], tmp_path: Path
) -> None:
    """An alias bomb of 600 bytes in a run's config.yaml: compare read it with
    yaml.safe_load, outside the config limits, and ran for minutes."""
    bomb = tmp_path / "bomb"
    shutil.copytree(two_runs[0], bomb)
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    config = bomb / "config.yaml"
    config.chmod(0o644)
    config.write_text("\n".join(lines) + "\n", encoding="utf-8")
    rows = config_differences([read_run(bomb), read_run(two_runs[1])])
    (shown,) = [row[1] for row in rows if row[0] == "config.yaml"]
    assert shown.startswith("(cannot be read:")
