"""Names a config gives to files that components write are plain names inside the run folder:
`loom check` refuses a path (`../../x`, `/abs/x`, `a/b`), `.`, `..` or an empty name, naming
the file, the line, the component and the key, before any data is read or any file written.
The run folder's own name (`name:`) and tag (`--tag`) are refused where they would put it
outside `--expdir`, hide it, or be too long for the file system.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from loom_cli_harness import GOOD_CONFIG, assert_user_error, run_loom, write_config

from torchloom.core.file_names import file_name_problem
from torchloom.engine.run_folder import create_run_folder
from torchloom.errors import ConfigError, LoomError

NOT_PLAIN = ["../../victim.csv", "/abs/victim.csv", "sub/x.csv", "..", ".", "", "a\\b.csv"]


@pytest.mark.parametrize("filename", NOT_PLAIN)
def test_check_refuses_an_exporter_file_name_that_is_not_plain(
    filename: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exporter = (
        "  exporter:\n    type: StreamFileExporter\n    input_streams: [targets]\n"
        f"    filename: '{filename}'\n"
    )
    bad = write_config(tmp_path, GOOD_CONFIG + exporter)
    line = GOOD_CONFIG.count("\n") + 4
    assert_user_error(
        run_loom(capsys, "check", str(bad)),
        f"bad.yml:{line}",
        "component 'exporter' (StreamFileExporter)",
        "parameter 'filename'",
        "plain file name",
    )


@pytest.mark.parametrize(
    "filename",
    [
        "config.yaml",
        "summary.json",
        "run.log",
        "training_statistics.csv",
        "test_summary.json",
        "checkpoints",  # the run failed at its first save, its training lost
        "reports",
    ],
)
def test_check_refuses_an_exporter_file_name_the_folder_already_has(
    filename: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`filename: config.yaml` replaced the run's config with CSV rows (the run could not be
    resumed or processed); `training_statistics.csv`, its statistics."""
    exporter = (
        "  exporter:\n    type: StreamFileExporter\n    input_streams: [targets]\n"
        f"    filename: {filename}\n"
    )
    bad = write_config(tmp_path, GOOD_CONFIG + exporter)
    assert_user_error(
        run_loom(capsys, "check", str(bad)),
        f"bad.yml:{GOOD_CONFIG.count(chr(10)) + 4}",
        "component 'exporter' (StreamFileExporter)",
        "parameter 'filename'",
        f"'{filename}' is a file or folder the run or pass folder already has",
    )
    named = GOOD_CONFIG + exporter.replace(filename, "my_statistics.csv")  # no worker's file
    assert run_loom(capsys, "check", str(write_config(tmp_path, named, "ok.yml"))).status == 0


def test_process_never_writes_an_exporter_file_outside_its_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "victim.csv"
    victim.write_text("precious\n")
    exporter = (
        "  exporter:\n    type: StreamFileExporter\n    input_streams: [targets]\n"
        f"    filename: {victim}\n"
        f"training:\n  task: {{data_folder: {tmp_path / 'mnist'}}}\n"
        "test:\n  task: {subset: 16}\n"
    )
    bad = write_config(tmp_path, GOOD_CONFIG + exporter)
    runs = tmp_path / "runs"
    result = run_loom(capsys, "process", str(bad), "--expdir", str(runs), "--device", "cpu")
    assert_user_error(result, "parameter 'filename'")
    assert victim.read_text() == "precious\n"
    assert not runs.exists(), "nothing is created for a refused config"


@pytest.mark.parametrize("name", ["../x", "/tmp/x", "a/b"])
def test_check_refuses_an_analysis_output_name_that_is_not_plain(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    analysis = f"analysis:\n  outputs:\n    - {{name: '{name}'}}\n"
    bad = write_config(tmp_path, GOOD_CONFIG + analysis)
    assert_user_error(
        run_loom(capsys, "check", str(bad)),
        f"bad.yml:{GOOD_CONFIG.count(chr(10)) + 3}",
        "analysis.outputs.0.name",
        "plain file name",
    )


@pytest.mark.parametrize("name", ["/tmp/viewer", "a/b", "a\\b"])
def test_check_refuses_a_component_name_that_is_a_path(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A component's name becomes file names (`viewers/<name>-...png`, `artifacts/<name>/`)."""
    viewer = f"  '{name}': {{type: ImageViewer, images: inputs}}\n"
    bad = write_config(tmp_path, GOOD_CONFIG + viewer)
    assert_user_error(
        run_loom(capsys, "check", str(bad)),
        f"bad.yml:{GOOD_CONFIG.count(chr(10)) + 1}",
        f"component '{name}'",
        "path separator",
    )


def test_plain_names_pass() -> None:
    for name in ("answers.csv", "x", "..csv", "a b.csv", "é.csv", "x" * 255):
        assert file_name_problem(name) == "", name
    assert file_name_problem("x" * 256) != ""
    assert file_name_problem("é" * 128) != "", "the limit is in bytes"


# ---- the run folder's name and tag ---------------------------------------------------------
SMALL = ["+training.task.subset=64", "training.terminal_conditions.epoch_limit=1"]


@pytest.mark.parametrize("name", ["..", ".", ".hidden", "x" * 101])
def test_a_name_that_cannot_name_run_folders_is_refused_before_anything_is_created(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = f"name: '{name}'\n{GOOD_CONFIG}training:\n  task: {{data_folder: {tmp_path / 'd'}}}\n"
    bad = write_config(tmp_path, config)
    work = tmp_path / "work"
    expdir = work / "runs"
    for command in (["check"], ["train", "--expdir", str(expdir), "--quiet"]):
        result = run_loom(capsys, *command, str(bad), *SMALL)
        assert_user_error(result, "bad.yml:1", "key 'name'", "names the run folders")
    assert not work.exists(), "nothing is created, inside or outside --expdir"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yml"], "no data read either"


def test_a_tag_too_long_for_a_folder_name_is_refused_before_anything_is_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = f"{GOOD_CONFIG}training:\n  task: {{data_folder: {tmp_path / 'd'}}}\n"
    good = write_config(tmp_path, config, "good.yml")
    expdir = tmp_path / "runs"
    result = run_loom(
        capsys, "train", str(good), *SMALL, "--expdir", str(expdir), "--tag", "t" * 300
    )
    assert_user_error(result, "--tag 'ttt", "300 characters long", "more than the 100")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.yml"]


def test_a_tag_or_a_list_option_that_names_nothing_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--tag ///` ended the run folder's name with `-`, as every such tag would; `--disable ,`
    disabled nothing without a word."""
    config = f"{GOOD_CONFIG}training:\n  task: {{data_folder: {tmp_path / 'd'}}}\n"
    good = write_config(tmp_path, config, "good.yml")
    expdir = tmp_path / "runs"
    result = run_loom(capsys, "train", str(good), *SMALL, "--expdir", str(expdir), "--tag", "///")
    assert_user_error(result, "--tag '///'", "no letter or digit", "use letters or digits")
    result = run_loom(capsys, "check", str(good), "--disable", ",")
    assert result.status == 2 and "',' names nothing" in result.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.yml"]


def test_create_run_folder_checks_names_given_in_python(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"name '\.\.'"):
        create_run_folder(tmp_path / "runs", "..")
    with pytest.raises(ConfigError, match="--tag"):
        create_run_folder(tmp_path / "runs", "fine", tag="x" * 101)
    assert not (tmp_path / "runs").exists()
    folder = create_run_folder(tmp_path / "runs", "a b/c", tag="x" * 100, now=1_000_000.0)
    assert folder.parent.name == "a-b-c" and folder.name.endswith("_" + "x" * 100)


def test_a_run_folder_with_symbolic_links_is_not_written_into(tmp_path: Path) -> None:
    """A run folder copied from someone else keeps its links: `exports -> ../elsewhere` had
    `loom export` write the model there while it named the path inside the run."""
    from torchloom.deploy.run_model import load_trained_run
    from torchloom.engine.processor import process
    from torchloom.engine.run_lock import RunLock

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("name: run\n", encoding="utf-8")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run / "exports").symlink_to(elsewhere)
    for writes in (lambda: load_trained_run(run), lambda: process(run), RunLock(run).acquire):
        with pytest.raises(LoomError) as refused:
            writes()
        assert "holds symbolic links (exports)" in refused.value.format()
    assert list(elsewhere.iterdir()) == []
