"""`loom runs [EXPDIR] [--sort STAT]`: the table of runs for model selection."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import torchloom
from torchloom.analysis.runs_table import list_runs, sort_runs
from torchloom.cli import runs as runs_command
from torchloom.cli.main import main
from torchloom.errors import ConfigError

SMALL_RUN = """\
default_configs: [loom://mnist/lenet5.yml]
training:
  task: {{data_folder: {data}, subset: 256}}
  terminal_conditions: {{epoch_limit: 1}}
validation:
  task: {{subset: 128}}
test:
  task: {{subset: 128}}
"""


def fake_run(
    expdir: Path, pipeline: str, stamp: str, accuracy: float | None, loss: float, **extra: Any
) -> Path:
    """A finished run's summary.json, shaped like the one `loom train` writes."""
    folder = expdir / pipeline / stamp
    folder.mkdir(parents=True)
    best = {"validation.loss": loss}
    if accuracy is not None:
        best["validation.accuracy"] = accuracy
    summary = {
        "pipeline": pipeline,
        "status": "early_stopped",
        "epochs": 5,
        "monitor": {"name": "validation.loss", "mode": "min", "best": loss, "best_epoch": 4},
        "best": best,
        "final": {"validation": {"loss": loss + 0.1}, "test": {"accuracy": 0.5}},
        **extra,
    }
    (folder / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def expdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three fake runs and one real one (its folder name is today's date)."""
    folder = tmp_path_factory.mktemp("runs")
    experiments = folder / "experiments"
    fake_run(experiments, "mlp", "20240101_090000", 0.91, 0.30)
    fake_run(experiments, "mlp", "20240102_090000_wide", 0.97, 0.12)
    fake_run(experiments, "cnn", "20240103_090000", None, 0.50)  # no accuracy statistic
    (experiments / "cnn" / "20240104_090000").mkdir()  # no summary.json: not a run
    (experiments / "notes.txt").write_text("not a run")
    config = folder / "small.yml"
    config.write_text(SMALL_RUN.format(data=folder / "mnist"), encoding="utf-8")
    torchloom.train(config, expdir=str(experiments), analysis=False, tensorboard=0)
    return experiments


def show(expdir: Path, capsys: pytest.CaptureFixture[str], **options: Any) -> list[str]:
    """The lines `loom runs` prints for its rows (header and separator dropped)."""
    arguments = {"expdir": str(expdir), "sort": None, "limit": None, "descending": None}
    assert runs_command.run(Namespace(**{**arguments, **options})) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["pipeline", "date", "status", "epochs"]
    assert lines[0].split()[-1] == "folder"
    return lines[2:]


def folders(lines: list[str]) -> list[str]:
    """`<pipeline>/<stamp>` of each row (the folder is the last column), the real run's
    stamp (today's date) replaced by 'now'."""
    names = ["/".join(Path(line.split()[-1]).parts[-2:]) for line in lines]
    return ["small/now" if name.startswith("small/") else name for name in names]


def test_every_run_is_listed_newest_first(expdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = show(expdir, capsys)
    assert folders(lines) == [
        "small/now",
        "cnn/20240103_090000",
        "mlp/20240102_090000_wide",
        "mlp/20240101_090000",
    ]
    assert "2024-01-02 09:00:00" in lines[2] and "validation.loss=0.1200" in lines[2]
    assert "early_stopped" in lines[2]
    assert lines[0].split()[0] == "small" and "epoch_limit" in lines[0]
    assert "validation.accuracy=0." in lines[0], "the real run's monitored statistic"


def test_sort_by_accuracy_is_highest_first_and_runs_without_it_last(
    expdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    real = list_runs(expdir)[0].run.statistic("validation.accuracy")
    assert real is not None
    ranked = sorted(
        [("mlp/20240102_090000_wide", 0.97), ("mlp/20240101_090000", 0.91), ("small/now", real)],
        key=lambda pair: -pair[1],
    )
    lines = show(expdir, capsys, sort="validation.accuracy")
    assert folders(lines) == [name for name, _ in ranked] + ["cnn/20240103_090000"]
    ascending = show(expdir, capsys, sort="validation.accuracy", descending=False)
    assert folders(ascending) == [name for name, _ in reversed(ranked)] + ["cnn/20240103_090000"]


def test_sort_by_a_loss_is_lowest_first_unless_told(
    expdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = sort_runs(list_runs(expdir), "validation.loss")
    values = [row.sort_value for row in rows]
    assert None not in values and values == sorted(v for v in values if v is not None)
    assert folders(show(expdir, capsys, sort="validation.loss"))[:3] == [
        "mlp/20240102_090000_wide",
        "mlp/20240101_090000",
        "cnn/20240103_090000",
    ], "0.12 < 0.30 < 0.50 (the real run's untrained loss is about 2)"
    descending = sort_runs(list_runs(expdir), "validation.loss", descending=True)
    assert [row.sort_value for row in descending] == list(reversed(values))


def test_sort_by_a_test_statistic_and_limit(
    expdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = show(expdir, capsys, sort="test.loss", limit=2)
    assert folders(lines)[0] == "small/now" and len(lines) == 2, "only the real run has one"
    lines = show(expdir, capsys, sort="test.accuracy", limit=2)
    assert len(lines) == 2


def test_a_misspelt_sort_statistic_is_a_user_error_with_a_suggestion(expdir: Path) -> None:
    with pytest.raises(ConfigError, match=r"did you mean 'validation\.accuracy'"):
        sort_runs(list_runs(expdir), "validation.acuracy")


def test_a_missing_expdir_is_a_user_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match="does not exist") as error:
        list_runs(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(error.value)
    arguments = {"sort": None, "limit": None, "descending": None}
    assert runs_command.run(Namespace(expdir=str(tmp_path), **arguments)) == 0
    assert "no runs under" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="--limit"):
        runs_command.run(Namespace(expdir=str(tmp_path), **{**arguments, "limit": 0}))


def loom(capsys: pytest.CaptureFixture[str], *argv: str) -> SimpleNamespace:
    """`loom ARGV...` in this process: its exit status and what it printed."""
    capsys.readouterr()
    status = main(list(argv))
    captured = capsys.readouterr()
    return SimpleNamespace(status=status, out=captured.out, err=captured.err)


# ---- a malformed summary.json: flagged in the listing, a user error when named -------------
MALFORMED = {  # summary.json field -> a value of the wrong type, and the field's name shown
    "monitor_a_string": ({"monitor": "x"}, "monitor"),
    "monitor_best_a_word": (
        {"monitor": {"name": "validation.loss", "best": "low"}},
        "monitor.best",
    ),
    "best_a_number": ({"best": 3}, "best"),
    "best_value_a_list": ({"best": {"validation.loss": [1]}}, "best.validation.loss"),
    "final_a_list": ({"final": [1, 2]}, "final"),
    "final_section_a_string": ({"final": {"test": "good"}}, "final.test"),
    "final_value_an_object": ({"final": {"test": {"accuracy": {}}}}, "final.test.accuracy"),
    "epochs_an_object": ({"epochs": {}}, "epochs"),
    "epochs_negative": ({"epochs": -1}, "epochs"),
    "status_a_number": ({"status": 3}, "status"),
    "pipeline_a_list": ({"pipeline": ["a"]}, "pipeline"),
}


@pytest.fixture(scope="module")
def malformed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One good run and a run per malformed field (each the good one with one field wrong)."""
    experiments = tmp_path_factory.mktemp("malformed") / "experiments"
    fake_run(experiments, "good", "20240101_090000", 0.9, 0.3)
    for number, (case, (fields, _)) in enumerate(MALFORMED.items()):
        folder = fake_run(experiments, case, f"20240102_09{number:02d}00", 0.8, 0.4)
        summary = json.loads((folder / "summary.json").read_text())
        (folder / "summary.json").write_text(json.dumps({**summary, **fields}))
    (experiments / "not_json" / "20240103_090000").mkdir(parents=True)
    (experiments / "not_json" / "20240103_090000" / "summary.json").write_text("{oops")
    (experiments / "a_list" / "20240103_100000").mkdir(parents=True)
    (experiments / "a_list" / "20240103_100000" / "summary.json").write_text("[1]")
    (experiments / "too_deep" / "20240103_110000").mkdir(parents=True)
    deep = '{"final": ' + "[" * 100_000
    (experiments / "too_deep" / "20240103_110000" / "summary.json").write_text(deep)
    return experiments


def test_a_malformed_summary_is_listed_as_unreadable_and_the_rest_as_usual(
    malformed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for sort in (None, "validation.loss", "test.accuracy"):
        lines = show(malformed, capsys, sort=sort)
        assert len(lines) == len(MALFORMED) + 4, "every folder with a summary.json is a row"
        by_pipeline = {line.split()[0]: line for line in lines}
        assert "early_stopped" in by_pipeline["good"]
        assert "validation.loss=0.3000" in by_pipeline["good"]
        for case, (_, field) in MALFORMED.items():
            row = by_pipeline[case]
            assert f"unreadable (summary.json: '{field}' " in row, row
            assert row.split()[-1].endswith(f"{case}/20240102_09" + row.split()[-1][-4:])
        assert "unreadable (summary.json is not valid JSON" in by_pipeline["not_json"]
        assert "unreadable (summary.json is not a JSON object" in by_pipeline["a_list"]
        assert "unreadable (summary.json is nested too deeply" in by_pipeline["too_deep"]
        if sort is not None:  # runs without the statistic (the unreadable ones) come last
            assert lines[0].split()[0] == "good"
            assert all("unreadable" in line for line in lines[-(len(MALFORMED) + 3) :])


@pytest.mark.parametrize("case", ["monitor_a_string", "final_section_a_string", "epochs_an_object"])
def test_report_and_compare_of_a_malformed_run_name_the_folder_and_the_field(
    malformed: Path, case: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = next((malformed / case).iterdir())
    good = next((malformed / "good").iterdir())
    field = MALFORMED[case][1]
    report = loom(capsys, "report", str(bad))
    assert report.status == 2 and "Traceback" not in report.err
    assert str(bad) in report.err and f"'{field}'" in report.err, report.err
    assert not (bad / "report.html").exists()
    page = tmp_path / "compare.html"
    compared = loom(capsys, "compare", str(good), str(bad), "-o", str(page))
    assert compared.status == 2 and "Traceback" not in compared.err
    assert str(bad) in compared.err and f"'{field}'" in compared.err, compared.err
    assert not page.exists(), "nothing is written when a run cannot be read"


def test_a_statistic_s_direction_is_its_monitor_s_or_a_whole_word_of_its_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Substrings decided it: `answer_accuracy` holds "wer" (word error rate), so runs were
    ranked lowest first and `loom compare` marked the worst as best."""
    from torchloom.analysis.run_reading import lower_is_better, read_run

    assert not lower_is_better("validation.answer_accuracy")
    assert lower_is_better("validation.loss_a") and lower_is_better("validation.val_mse")
    assert lower_is_better("validation.loss_std") and not lower_is_better("validation.power")
    expdir = tmp_path / "runs"
    monitored = {"name": "validation.error_rate", "mode": "max", "best": 0.9, "best_epoch": 1}
    for stamp, value in (("20240101_090000", 0.3), ("20240102_090000", 0.9)):
        folder = fake_run(expdir, "vqa", stamp, None, 0.2)
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        summary["best"]["validation.answer_accuracy"] = value
        summary["best"]["validation.error_rate"] = value
        summary["monitor"] = monitored  # a statistic named like an error, maximised
        (folder / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    for statistic in ("validation.answer_accuracy", "validation.error_rate"):
        lines = show(expdir, capsys, sort=statistic)
        assert "0.9000" in lines[0], (statistic, lines)
    runs = [read_run(path) for path in sorted(expdir.glob("*/*"))]
    assert not lower_is_better("validation.error_rate", runs)


def test_an_online_run_is_ranked_by_its_full_pass_not_its_best_partial_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An online run's best was a partial validation (16 samples, 0.5), ranked above offline
    runs' full passes (96 samples) on the same scale."""
    expdir = tmp_path / "runs"
    fake_run(expdir, "mlp", "20240101_090000", 0.45, 0.3)
    online = fake_run(expdir, "mlp", "20240102_090000", 0.5, 0.3)
    summary = json.loads((online / "summary.json").read_text(encoding="utf-8"))
    summary["best"]["validation.samples"] = 16
    summary["final"]["validation"] = {"accuracy": 0.40, "samples": 96}
    (online / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    lines = show(expdir, capsys, sort="validation.accuracy")
    assert "0.4500" in lines[0] and "0.4000" in lines[1]


@pytest.mark.parametrize(
    "damage",
    [
        b"number,state,validation.loss\n0,complete,abc\n",  # a value that is no number
        b"number,validation.loss\n0,0.5\n",  # no state column
        b"\xff\xfe\x00garbage",  # not UTF-8
    ],
)
def test_a_damaged_trials_csv_leaves_the_listing_whole(
    tmp_path: Path, damage: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    """`loom runs` ended in a traceback and listed nothing when one search's trials.csv was
    damaged (only a missing file was expected)."""
    from torchloom.search.record import SearchRecord

    fake_run(tmp_path, "mlp", "20240101_090000", 0.91, 0.30)
    search = tmp_path / "searches" / "lenet" / "20240102_090000"
    search.mkdir(parents=True)
    SearchRecord("lenet", "lenet", "journal:study.journal", "validation.loss", "min", 4).save(
        search
    )
    (search / "trials.csv").write_bytes(damage)
    arguments = {"expdir": str(tmp_path), "sort": None, "limit": None, "descending": None}
    assert runs_command.run(Namespace(**arguments)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any("mlp" in line for line in lines)
    (listed,) = [line for line in lines if "lenet" in line]
    assert "trials.csv cannot be read" in listed


def test_sorting_runs_without_statistics_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The hint was "use a section.statistic name such as " and nothing after it."""
    (tmp_path / "mlp" / "20240101_090000").mkdir(parents=True)
    (tmp_path / "mlp" / "20240101_090000" / "summary.json").write_text("{", encoding="utf-8")
    with pytest.raises(ConfigError, match="no run here has statistics yet"):
        sort_runs(list_runs(tmp_path), "validation.accuracy")


def test_runs_ranked_on_different_numbers_of_samples_show_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """0.9 over 8 validation samples ranked above 0.8 over 128 without a word: the table
    shows the samples each value was measured on when they differ."""
    expdir = tmp_path / "runs"
    for stamp, accuracy, samples in (("20240101_090000", 0.8, 128), ("20240102_090000", 0.9, 8)):
        folder = fake_run(expdir, "mlp", stamp, accuracy, 0.3)
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        summary["best"]["validation.samples"] = samples
        summary["final"]["validation"]["samples"] = samples
        (folder / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    assert (
        runs_command.run(
            Namespace(expdir=str(expdir), sort="validation.accuracy", limit=None, descending=None)
        )
        == 0
    )
    header, _, first, second = capsys.readouterr().out.splitlines()
    assert header.split()[-2:] == ["validation.samples", "folder"]
    assert first.split()[-2] == "8" and second.split()[-2] == "128"
    fake_run(tmp_path / "same", "mlp", "20240101_090000", 0.8, 0.3)
    sort = Namespace(expdir=str(tmp_path / "same"), sort="validation.accuracy", limit=None)
    assert runs_command.run(Namespace(**vars(sort), descending=None)) == 0
    assert "samples" not in capsys.readouterr().out  # one count (here none): no column
