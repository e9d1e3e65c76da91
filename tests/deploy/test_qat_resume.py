"""`loom quantize --mode qat` fine-tunes through the engine, so a fine-tuning stopped by a
signal or killed is continued with `--resume` and ends as the same fine-tuning left alone
would: the same checkpoints, bit for bit, and the same int8 figures. The stopped runs are real
`loom quantize` processes; the reference, the resumes and the refusals run the same command in
the test's process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from torchloom.cli.main import main
from torchloom.deploy.qat import unfinished_fine_tuning
from torchloom.engine.run_folder import STARTED_BY_FILE

LOOM = [sys.executable, "-m", "torchloom.cli.main"]
# 24 batches an epoch (768 images of 32), last.pt every 4: a stop in the second epoch resumes
# mid-epoch.
QAT = ["--mode", "qat", "--qat-epochs", "2", "--qat-lr", "0.0002", "--repeats", "3"]
STOP_AFTER_EPISODE = 32


def saving_copy(run: Path, folder: Path) -> Path:
    """A copy of a trained run whose config saves last.pt every 4 batches (the fine-tuning
    run inherits the run's training settings)."""
    copy = folder / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("quantized", "exports"))
    config = copy / "config.yaml"
    config.chmod(stat.S_IRUSR | stat.S_IWUSR)
    text = config.read_text(encoding="utf-8")
    assert "\ntraining:\n" in text and "checkpoint_interval" not in text
    config.write_text(text.replace("\ntraining:\n", "\ntraining:\n  checkpoint_interval: 4\n"))
    return copy


def fine_tuning_runs(run: Path) -> list[Path]:
    return sorted((run / "quantized" / "qat_training").glob("*/*"))


def components(path: Path) -> dict[str, dict[str, torch.Tensor]]:
    return dict(torch.load(path, weights_only=True)["components"])


def assert_bit_identical(a: Path, b: Path) -> None:
    first, second = components(a), components(b)
    assert first.keys() == second.keys()
    for name in first:
        assert first[name].keys() == second[name].keys()
        for key, tensor in first[name].items():
            assert torch.equal(tensor, second[name][key]), f"{name}.{key} differs"


def report_of(run: Path) -> dict:
    path = run / "quantized" / "qat" / "quantization_report.json"
    return dict(json.loads(path.read_text(encoding="utf-8")))


def logged_episode(run: Path) -> int:
    for folder in fine_tuning_runs(run):
        log = folder / "training_statistics.csv"
        if log.exists():
            rows = log.read_text().strip().splitlines()
            if len(rows) > 1 and rows[-1].count(",") == rows[0].count(","):
                return int(rows[-1].split(",")[0])
    return 0


@pytest.fixture(scope="module")
def reference(lenet_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = saving_copy(lenet_run, tmp_path_factory.mktemp("reference"))
    assert main(["quantize", str(run), *QAT]) == 0
    return run


@pytest.mark.slow
@pytest.mark.parametrize("stop_signal", [signal.SIGKILL, signal.SIGINT], ids=["sigkill", "ctrl-c"])
def test_a_stopped_fine_tuning_resumes_to_the_uninterrupted_result(
    lenet_run: Path,
    reference: Path,
    tmp_path: Path,
    stop_signal: signal.Signals,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = saving_copy(lenet_run, tmp_path)
    process = subprocess.Popen(
        [*LOOM, "quantize", str(run), *QAT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + 300
    while logged_episode(run) < STOP_AFTER_EPISODE:
        assert process.poll() is None, f"it ended before it was stopped: {process.stderr}"
        assert time.monotonic() < deadline, "the fine-tuning made no progress"
        time.sleep(0.01)
    process.send_signal(stop_signal)
    _, stderr = process.communicate(timeout=120)
    (training,) = fine_tuning_runs(run)
    command = f"loom quantize {run} --mode qat --qat-epochs 2 --qat-lr 0.0002 --resume"
    if stop_signal == signal.SIGKILL:
        assert process.returncode == -signal.SIGKILL
    else:
        assert process.returncode == 130, stderr
        assert "Traceback" not in stderr and command in stderr
        # The fine-tuning's own log names the same command, not `loom train --resume`.
        log = (training / "run.log").read_text(encoding="utf-8")
        assert f"continue with `{command}`" in log and "loom train --resume" not in log
    assert not (run / "quantized" / "qat").exists()
    stopped = json.loads((training / "summary.json").read_text(encoding="utf-8"))
    assert stopped.get("episodes", 0) < 48

    # `loom train --resume` cannot rebuild the fake-quantized pipeline: it names the command.
    capsys.readouterr()
    assert main(["train", "--resume", str(training)]) == 2
    assert command in capsys.readouterr().err
    assert main(["quantize", str(run), *QAT, "--resume"]) == 0
    assert fine_tuning_runs(run) == [training]  # continued, not started again
    summary = json.loads((training / "summary.json").read_text(encoding="utf-8"))
    assert summary["status"] == "epoch_limit" and summary["episodes"] == 48
    (expected,) = fine_tuning_runs(reference)
    for name in ("last.pt", "best.pt"):
        assert_bit_identical(expected / "checkpoints" / name, training / "checkpoints" / name)
    ours, theirs = report_of(run), report_of(reference)
    assert ours["statistics"] == theirs["statistics"]
    assert ours["size_bytes"] == theirs["size_bytes"]


def moved(reference: Path, folder: Path) -> tuple[Path, Path]:
    """A copy of the reference run with its fine-tuning run, whose record names the copy (as
    if it had been started there); the copy and its fine-tuning run folder."""
    run = folder / "run"
    shutil.copytree(reference, run)
    (training,) = fine_tuning_runs(run)
    record = json.loads((training / STARTED_BY_FILE).read_text(encoding="utf-8"))
    record["source_run"] = str(run)
    record["checkpoint"] = str(run / "checkpoints" / "best.pt")
    (training / STARTED_BY_FILE).write_text(json.dumps(record), encoding="utf-8")
    return run, training


def test_an_unfinished_fine_tuning_is_noted_when_a_new_one_starts(
    reference: Path, tmp_path: Path
) -> None:
    run, training = moved(reference, tmp_path)
    assert unfinished_fine_tuning(run) is None  # it reached its epoch limit
    summary = json.loads((training / "summary.json").read_text(encoding="utf-8"))
    summary["status"] = "interrupted"
    (training / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    assert unfinished_fine_tuning(run) == training


def test_resume_refusals_are_plain(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run, _ = moved(reference, tmp_path)
    quantized = run / "quantized" / "qat"
    before = (quantized / "quantization_report.json").read_bytes()

    def refused(*args: str) -> str:
        capsys.readouterr()
        assert main(["quantize", str(run), *args]) == 2
        return capsys.readouterr().err

    assert "trains nothing" in refused("--mode", "static", "--resume")
    message = refused(*QAT[:-2], "--qat-lr", "0.001", "--resume", "--force")
    assert "qat_lr 0.0002 (now 0.001)" in message and "--qat-lr 0.0002 --resume" in message
    assert "is not a quantization-aware fine-tuning run" in refused(
        *QAT, "--resume", str(reference), "--force"
    )
    # quantized/qat is there: the refusal says that the resumed fine-tuning converts into it
    # (a finished fine-tuning is converted again with --force, which the docs only implied).
    message = refused(*QAT, "--resume")
    assert "already holds the results" in message
    assert "the fine-tuning --resume continues converts into it, add --force" in message
    assert (quantized / "quantization_report.json").read_bytes() == before
    fresh = tmp_path / "fresh"
    shutil.copytree(reference, fresh, ignore=shutil.ignore_patterns("quantized"))
    capsys.readouterr()
    assert main(["quantize", str(fresh), *QAT, "--resume"]) == 2
    assert "holds no quantization-aware fine-tuning run" in capsys.readouterr().err


def test_resuming_a_finished_fine_tuning_converts_it_without_training_again(
    reference: Path, tmp_path: Path
) -> None:
    run, training = moved(reference, tmp_path)
    shutil.rmtree(run / "quantized" / "qat")  # as if killed after training, before writing
    checkpoint = (training / "checkpoints" / "last.pt").stat().st_mtime_ns
    assert main(["quantize", str(run), *QAT, "--resume", str(training)]) == 0
    assert (training / "checkpoints" / "last.pt").stat().st_mtime_ns == checkpoint
    assert fine_tuning_runs(run) == [training]
    assert report_of(run)["statistics"] == report_of(reference)["statistics"]


def test_a_fine_tuning_resumes_however_its_run_folder_is_spelled(
    reference: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record names the run folder as the first command spelled it; a resume that named
    it otherwise (relative, here) was refused as started with other options."""
    run, training = moved(reference, tmp_path)
    shutil.rmtree(run / "quantized" / "qat")
    monkeypatch.chdir(tmp_path)
    assert main(["quantize", "run", *QAT, "--resume", str(training)]) == 0
    assert report_of(run)["run_dir"] == str(run)
