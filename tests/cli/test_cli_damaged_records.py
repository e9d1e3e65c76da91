"""Records torchloom writes into its folders, received damaged: a JSON text nested thousands
of levels deep made Python's parser raise RecursionError, which no reader caught (a traceback,
exit 1, from `loom train --resume`, `loom process`, `loom export`, `loom report`). Each command
now reads such a record as the damaged one it is: as absent where an absent one has a
meaning, else a user error that names the file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from loom_cli_harness import run_loom

from toy_runs import only_run, toy_config, train, write

NESTED = "[" * 100_000 + "]" * 100_000
STARTED_BY_DAMAGED = "has a started_by.json that cannot be read"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("trained")
    train(write(folder, toy_config(epochs=1)), folder / "runs")
    return only_run(folder / "runs")


def damaged_copy(trained: Path, tmp_path: Path, record: str) -> Path:
    run = Path(shutil.copytree(trained, tmp_path / "toy" / "run"))
    (run / record).write_text(NESTED, encoding="utf-8")
    return run


@pytest.mark.parametrize(
    ("record", "command", "status", "said"),
    [
        # The summary is rewritten by the resume; last.pt says where the run stands.
        ("summary.json", ["train", "--resume", "RUN"], 0, ""),
        ("summary.json", ["report", "RUN"], 2, "summary.json is nested too deeply"),
        # A record of the command that started the run, damaged: not `loom train`'s run.
        ("started_by.json", ["train", "--resume", "RUN"], 2, STARTED_BY_DAMAGED),
        ("started_by.json", ["process", "RUN"], 2, STARTED_BY_DAMAGED),
        ("started_by.json", ["export", "RUN"], 2, STARTED_BY_DAMAGED),
        # The lock's record says who holds the run, when one does: none here.
        (".lock", ["export", "RUN"], 0, ""),
    ],
)
def test_a_deeply_nested_record_is_no_traceback(
    trained: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    record: str,
    command: list[str],
    status: int,
    said: str,
) -> None:
    run = damaged_copy(trained, tmp_path, record)
    done = run_loom(capsys, *[str(run) if part == "RUN" else part for part in command])
    assert done.status == status, done.err[-3000:]
    assert said in done.err and "Traceback" not in done.err, done.err[-3000:]


def test_a_search_folder_whose_record_is_nested_too_deeply_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "search.json").write_text(NESTED, encoding="utf-8")
    done = run_loom(capsys, "report", str(tmp_path))
    assert done.status == 2, done.err[-3000:]
    assert "has no readable search.json (is nested too deeply" in done.err, done.err[-3000:]


def test_a_quantized_folder_whose_report_is_nested_too_deeply_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "model.pt").write_bytes(b"")
    (tmp_path / "quantization_report.json").write_text(NESTED, encoding="utf-8")
    done = run_loom(capsys, "process", str(tmp_path))
    assert done.status == 2, done.err[-3000:]
    assert "quantization_report.json': is nested too deeply" in done.err, done.err[-3000:]
