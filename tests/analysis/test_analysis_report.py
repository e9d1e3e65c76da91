"""`loom report RUN_DIR`: one self-contained page about a real (tiny) training run, checked by
parsing it, and as a person would look at it: in headless Chromium."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
from argparse import Namespace
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image, ImageStat

import torchloom
from torchloom.analysis.html_parts import markdown_html
from torchloom.analysis.html_report import write_report
from torchloom.cli import report as report_command
from torchloom.errors import ConfigError

SMALL_RUN = """\
default_configs: [loom://mnist/lenet5.yml]
training:
  task: {{data_folder: {data}, subset: 256}}
  logging_interval: 2
  seed: 3
  terminal_conditions: {{epoch_limit: 2}}
validation:
  task: {{subset: 128}}
test:
  task: {{subset: 128}}
"""
CHROMIUM = Path("/usr/bin/chromium")


def train_small(folder: Path, extra: str = "") -> Path:
    """A LeNet-5 run on 512 MNIST images: two epochs in a second or two."""
    config = folder / "small.yml"
    config.write_text(SMALL_RUN.format(data=folder / "mnist") + extra, encoding="utf-8")
    return torchloom.train(config, expdir=str(folder / "runs"), tensorboard=0).run_dir


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_small(tmp_path_factory.mktemp("report"))


@pytest.fixture
def run_copy(trained: Path, tmp_path: Path) -> Path:
    """A copy of the trained run that a test may change."""
    return Path(shutil.copytree(trained, tmp_path / "lenet5" / trained.name))


class Page(HTMLParser):
    """What a reader of the page gets: images, tables (as rows of cell texts), headings, text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.images: list[dict[str, str]] = []
        self.tables: list[list[list[str]]] = []
        self.links: list[str] = []
        self.ids: list[str] = []
        self.text: list[str] = []
        self._cell: list[str] | None = None
        self._section = ""  # the id of the last <h2>
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        if "id" in values:
            self.ids.append(values["id"])
        if tag == "h2":
            self._section = values.get("id", "")
        if tag == "img":
            self.images.append({**values, "section": self._section})
        elif tag in ("a", "link", "script", "iframe", "source"):
            self.links.append(values.get("href") or values.get("src") or tag)
        elif tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def captions(self, section: str) -> set[str]:
        return {image["alt"] for image in self.images if image["section"] == section}

    def table_with(self, header: list[str]) -> list[list[str]]:
        return next(t for t in self.tables if t and t[0][: len(header)] == header)


def decoded_png(image: dict[str, str]) -> Image.Image:
    prefix = "data:image/png;base64,"
    assert image["src"].startswith(prefix), image["src"][:60]
    picture = Image.open(io.BytesIO(base64.b64decode(image["src"][len(prefix) :], validate=True)))
    assert picture.format == "PNG"
    picture.load()
    return picture


def png(path: Path, size: tuple[int, int] = (40, 30), colour: str = "navy") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)


def add_analysis_files(run: Path) -> None:
    """The files the analysis hooks write, as they name them (contents made up)."""
    reports = run / "reports"
    png(reports / "fake-validation-cm.png", (120, 100))
    png(reports / "fake-validation-roc.png", (120, 100), "green")
    (reports / "fake-validation-cm.csv").write_text("class,0,1\n0,0.9,0.1\n1,0.2,0.8\n")
    (reports / "fake-validation-report.md").write_text(
        "# predictions on validation\n\naccuracy: **0.91**\n\n"
        "| class | precision | recall | f1 | support |\n|---|---:|---:|---:|---:|\n"
        "| 0 | 0.90 | 0.80 | 0.85 | 12 |\n| 1 | 0.50 | 0.40 | 0.44 | 14 |\n\n"
        "- 4 -> 9: 5 times\n"
    )
    png(reports / "history" / "validation-accuracy.png")
    png(reports / "worst_samples" / "heatmap.png", (90, 60), "red")
    png(reports / "worst_samples" / "rank01_id12.png", (28, 28), "white")
    (reports / "worst_samples" / "worst.csv").write_text(
        "rank,id,target,prediction,loss\n1,12,4,9,3.5\n"
    )
    png(reports / "samples" / "training.png")
    (reports / "layer_statistics.csv").write_text(
        "episode,layer,activation_mean,gradient_norm\n4,conv1,0.1,0.01\n4,fc,0.2,0.02\n"
        "8,conv1,0.15,0.011\n8,fc,0.25,0.021\n"
    )
    (reports / "model_summary.md").write_text(
        "| component | trainable | frozen |\n|---|---|---|\n| image_classifier | 61706 | 0 |\n"
    )
    png(reports / "learning_rate.png")
    png(reports / "augmentation" / "draws.png")  # an analysis the report has no section for


def test_report_is_self_contained_and_every_image_is_a_png(trained: Path) -> None:
    output = write_report(trained)
    assert output == trained / "report.html"
    text = output.read_text(encoding="utf-8")
    page = Page(text)
    assert page.images, "the history curves at least"
    for image in page.images:
        assert decoded_png(image).size[0] > 10
    # No script, stylesheet or link leaves the page (in-page anchors are fine).
    assert all(link.startswith("#") for link in page.links), page.links
    assert not re.search(r"\b(?:src|href)=\"(?!data:|#)", text)
    assert "http://" not in text and "https://" not in text


def test_report_names_the_status_and_the_final_statistics(trained: Path) -> None:
    summary = json.loads((trained / "summary.json").read_text(encoding="utf-8"))
    page = Page(write_report(trained).read_text(encoding="utf-8"))
    words = " ".join(page.text)
    assert "status: epoch_limit" in " ".join(words.split())
    final = page.table_with(["statistic", "training", "validation", "test"])
    accuracy = next(row for row in final if row[0] == "accuracy")
    final_accuracy = [summary["final"][s]["accuracy"] for s in ("training", "validation", "test")]
    assert [float(v) for v in accuracy[1:]] == pytest.approx(final_accuracy, abs=5e-5)
    facts = {row[0]: row[1] for row in page.table_with(["", "value"])[1:]}
    assert facts["epochs"] == "2" and facts["seed"] == "3" and facts["device"] == "cpu"
    assert facts["best monitored statistic"].startswith("validation.accuracy = 0.")
    assert "history" in page.ids and "config" in page.ids


def test_report_draws_history_curves_from_the_csvs_without_reports_history(run_copy: Path) -> None:
    shutil.rmtree(run_copy / "reports" / "history", ignore_errors=True)
    page = Page(write_report(run_copy).read_text(encoding="utf-8"))
    assert {"loss", "accuracy"} <= page.captions("history")
    for image in page.images:
        if image["section"] != "history":
            continue
        picture = decoded_png(image).convert("L")
        assert ImageStat.Stat(picture).stddev[0] > 5, f"{image['alt']} is blank"


def test_history_pictures_older_than_the_statistics_give_way_to_curves_from_them(
    run_copy: Path,
) -> None:
    """A run drawn during training, then stopped (a pruned trial) or killed, kept pictures
    that ended epochs early: the report showed them as its history."""
    import os

    add_analysis_files(run_copy)
    old = (run_copy / "reports" / "history" / "validation-accuracy.png").stat().st_mtime - 60
    for picture in (run_copy / "reports" / "history").glob("*.png"):
        os.utime(picture, (old, old))
    page = Page(write_report(run_copy).read_text(encoding="utf-8"))
    assert {"loss", "accuracy"} <= page.captions("history")
    assert "validation-accuracy" not in page.captions("history")


def test_report_shows_every_analysis_file_that_exists(run_copy: Path) -> None:
    add_analysis_files(run_copy)
    page = Page(write_report(run_copy).read_text(encoding="utf-8"))
    for section in ("history", "classification", "worst", "samples", "layers", "model", "other"):
        assert section in page.ids, section
    assert {"fake-validation-cm", "fake-validation-roc"} <= page.captions("classification")
    assert "rank01_id12" in page.captions("worst") and "training" in page.captions("samples")
    assert "draws" in page.captions("other")
    # reports/history replaces the page's own curves
    history = {p.stem for p in (run_copy / "reports" / "history").glob("*.png")}
    assert page.captions("history") == history | {"learning rate"}
    per_class = [
        ["class", "precision", "recall", "f1", "support"],
        ["0", "0.90", "0.80", "0.85", "12"],
        ["1", "0.50", "0.40", "0.44", "14"],
    ]
    assert per_class in page.tables, "the markdown table as an HTML table"
    assert page.table_with(["rank", "id", "target", "prediction", "loss"])[1][:2] == ["1", "12"]
    layers = page.table_with(["episode", "layer"])
    assert [row[:2] for row in layers[1:]] == [["8", "conv1"], ["8", "fc"]], "last per layer"
    assert page.table_with(["component", "trainable", "frozen"])[1][0] == "image_classifier"
    for image in page.images:
        decoded_png(image)


def test_report_escapes_text_from_the_run(run_copy: Path) -> None:
    with open(run_copy / "config.yaml", "a", encoding="utf-8") as handle:
        handle.write('note: "<script>alert(1)</script><img src=x>"\n')
    (run_copy / "reports").mkdir(exist_ok=True)
    (run_copy / "reports" / "model_summary.md").write_text("| a<b> | `<i>` |\n|--|--|\n| 1 | 2 |\n")
    text = write_report(run_copy).read_text(encoding="utf-8")
    assert "<script" not in text and "<img src=x" not in text and "<b>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "<code>&lt;i&gt;</code>" in text


def test_markdown_pipe_tables_headings_and_lists() -> None:
    text = markdown_html("## Top\n\n| a | b |\n|:--|--:|\n| x \\| y | 2 |\n\n- one\n- two\n")
    assert "<h4>Top</h4>" in text
    assert "<th>a</th><th>b</th>" in text and "<td>x | y</td>" in text
    assert '<td class="num">2</td>' in text and "<li>two</li>" in text


def test_a_folder_that_is_not_a_run_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist") as missing:
        write_report(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(missing.value)
    with pytest.raises(ConfigError, match=r"no summary\.json") as empty:
        write_report(tmp_path)
    assert str(tmp_path) in str(empty.value)


def test_loom_report_prints_the_page_it_wrote(
    trained: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert report_command.run(Namespace(run_dirs=[str(trained)])) == 0
    assert str(trained / "report.html") in capsys.readouterr().out


# ---- as a person would look at it ----------------------------------------------------------
PROBE = """<script>window.addEventListener("load", () => {
  const images = [...document.images];
  const loaded = images.filter((i) => i.complete && i.naturalWidth > 0).length;
  document.body.setAttribute("data-images-loaded", loaded + "/" + images.length);
});</script>"""


def chromium(page: Path, profile: Path, *options: str) -> subprocess.CompletedProcess[str]:
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=5000",
        *options,
        page.as_uri(),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def console_messages(stderr: str) -> list[str]:
    # Chromium logs every console message of the page as ':CONSOLE'; a page without scripts
    # has none, so any one is an error (a blocked resource, a parse problem).
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


@pytest.mark.skipif(
    not CHROMIUM.exists(), reason="Debian chromium is not installed (make test installs it)"
)
def test_report_in_headless_chromium(run_copy: Path, tmp_path: Path) -> None:
    add_analysis_files(run_copy)
    report = write_report(run_copy)
    expected = len(Page(report.read_text(encoding="utf-8")).images)

    screenshot = tmp_path / "report.png"
    shot = chromium(
        report, tmp_path / "profile-1", f"--screenshot={screenshot}", "--window-size=1280,2000"
    )
    print(f"report screenshot: {screenshot}")
    assert screenshot.is_file(), shot.stderr[-2000:]
    picture = Image.open(screenshot).convert("L")
    assert picture.size == (1280, 2000)
    assert ImageStat.Stat(picture).stddev[0] > 10, "the screenshot is blank"
    assert console_messages(shot.stderr) == []

    # Whether every image loaded, asked of the browser by a probe in a copy of the page (the
    # page itself has no script).
    probe = tmp_path / "probe.html"
    probe.write_text(report.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"))
    dom = chromium(probe, tmp_path / "profile-2", "--dump-dom")
    assert f'data-images-loaded="{expected}/{expected}"' in dom.stdout, dom.stderr[-2000:]
    assert console_messages(dom.stderr) == []


def test_a_statistics_file_that_cannot_be_read_is_named_not_left_out(
    run_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A damaged validation_epoch_statistics.csv: the page showed the other curves as the
    whole run, without a word."""
    from torchloom.cli.main import main

    damaged = run_copy / "validation_epoch_statistics.csv"
    damaged.chmod(0o644)
    damaged.write_bytes(bytes(range(256)) * 8)
    page = write_report(run_copy).read_text(encoding="utf-8")
    assert "cannot be read" in page and "validation_epoch_statistics.csv: not UTF-8" in page
    assert main(["report", str(run_copy)]) == 0
    assert "not shown, cannot be read: validation_epoch_statistics.csv" in capsys.readouterr().out


def test_loom_report_reads_each_statistics_file_once_to_check_it(
    run_copy: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page's check that each statistics CSV can be read, then the command's, read every
    file whole twice, besides the reading of its curves (once): three times for a long run's
    hundreds of megabytes. The curves are drawn from the files here (no history pictures)."""
    import builtins
    import io
    from collections import Counter

    from torchloom.cli.main import main

    shutil.rmtree(run_copy / "reports" / "history")
    opened: Counter[str] = Counter()
    real_open = builtins.open

    def counting_open(file: object, *args: object, **kwargs: object) -> object:
        if str(file).endswith("statistics.csv"):
            opened[Path(str(file)).name] += 1
        return real_open(file, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(io, "open", counting_open)  # pathlib's read_text and open
    assert main(["report", str(run_copy)]) == 0
    assert "written:" in capsys.readouterr().out
    files = {p.name for p in run_copy.glob("*statistics.csv")}
    assert set(opened) == files and len(files) >= 4
    # once for the check, once for the curves of the page
    assert max(opened.values()) == 2, opened
