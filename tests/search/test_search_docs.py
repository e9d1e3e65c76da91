"""docs/search.md's examples run: its search config through `loom search` (on a few MNIST
images), its space file with `--space`, and its bad space refused with the message the page
shows. (tests/docs checks every page's configs with `loom check` too.)"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from torchloom.cli.main import main

PAGE = Path(__file__).resolve().parents[2] / "docs" / "search.md"
BLOCK = re.compile(r"<!-- (.*?) -->\n```(\w+)\n(.*?)```", re.S)


def _blocks() -> list[tuple[str, str, str]]:
    return BLOCK.findall(PAGE.read_text(encoding="utf-8"))


def _block(marker: str) -> str:
    (text,) = [text for m, _, text in _blocks() if m == marker]
    return text


def _small(data: Path) -> list[str]:
    return [
        f"training.task.data_folder={data}",
        "++training.task.subset=256",
        "++validation.task.subset=64",
        "++test.task.subset=64",
        "training.terminal_conditions.epoch_limit=1",
    ]


def test_the_search_config_and_the_space_file_run(
    tmp_path: Path, mnist_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("search_lenet5.yml").write_text(_block("as: search_lenet5.yml"), encoding="utf-8")
    (space,) = [t for m, lang, t in _blocks() if m == "fragment" and lang == "yaml"]
    Path("space.yml").write_text(space, encoding="utf-8")
    base = ["search", "search_lenet5.yml", *_small(mnist_folder), "--trials", "2"]
    assert main([*base, "--expdir", "a"]) == 0
    assert main([*base, "--space", "space.yml", "--expdir", "b"]) == 0
    for expdir, names in (("a", {"lr", "batch_size", "type"}), ("b", {"lr", "batch_size"})):
        (found,) = Path(expdir).glob("searches/*/*")
        with open(found / "trials.csv", newline="") as handle:
            rows = list(csv.DictReader(handle))
        assert len(rows) == 2
        assert {key.rsplit(".", 1)[-1] for key in rows[0] if key.startswith("training.")} >= names


def test_the_bad_space_says_what_the_page_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("bad_space.yml").write_text(_block("expect-error: bad_space.yml"), encoding="utf-8")
    shown = next(t for m, lang, t in _blocks() if lang == "console" and "bad_space" in t)
    assert main(["check", "bad_space.yml"]) == 2
    error = capsys.readouterr().err
    assert error.strip() == shown.split("\n", 1)[1].strip()
