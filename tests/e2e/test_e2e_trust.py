"""How real `loom train` processes end and resume at the edges: killed after the epoch's last,
partial batch was saved; stopped with SIGTERM during the final test pass; two trainers on one
run folder; a disk that fills up; read-only folders. The runs stopped are real processes; the
reference and the resumes (`torchloom.train`, the engine `loom train` runs) and a refusal
(the CLI's `main()`) run in the test's process."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_helpers import LOOM, assert_bit_identical, summary, weights

import torchloom
from in_process_loom import run_loom as loom_here
from torchloom.config import dump_config
from torchloom.engine.checkpoint import load_checkpoint
from torchloom.engine.run_lock import run_liveness

TESTS = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "PYTHONUNBUFFERED": "1",
    "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p),
}


def toy_config(
    folder: Path, held: Path | None = None, held_from: int = 1, **training: object
) -> Path:
    """A toy pipeline that trains in a second; evaluation passes sleep 0.3 s per batch so a
    test can stop the process inside one, and wait while the file `held` exists (from their
    `held_from`-th batch on)."""
    config = {
        "name": "toy",
        "training": {
            "task": {"type": "toy_components:ToyTask", "size": 40},
            "dataloader": {"batch_size": 16},  # 3 batches an epoch, the last one of 8
            "optimizer": {"type": "SGD", "lr": 0.1},
            "seed": 5,
            "logging_interval": 1,
            "terminal_conditions": {"epoch_limit": 2},
            **training,
        },
        "validation": {"task": {"type": "toy_components:ToyTask", "size": 32}},
        "test": {
            "task": {"type": "toy_components:ToyTask", "size": 32},
            "dataloader": {"batch_size": 8},  # 4 batches: a signal lands inside the pass
        },
        "pipeline": {
            "model": {
                "type": "toy_components:ToyLinear",
                "globals": {"prediction_size": "num_classes"},
            },
            "loss": {"type": "toy_components:ToyLoss"},
            "slow": {"type": "trust_components:SlowInEvaluation", "seconds": 0.3},
        },
    }
    if held is not None:
        marker = {
            "type": "trust_components:HeldInEvaluation",
            "marker": str(held),
            "from_call": held_from,
        }
        config["pipeline"]["held"] = marker  # type: ignore[index]
    path = folder / "toy.yml"
    path.write_text(dump_config(config), encoding="utf-8")
    return path


def loom(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LOOM, *args], capture_output=True, text=True, env=ENV, timeout=120, check=False
    )


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*LOOM, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV
    )


def wait_for_log(process: subprocess.Popen[str], expdir: Path, text: str) -> Path:
    deadline = time.monotonic() + 120
    while True:
        runs = [p for p in expdir.glob("*/*") if (p / "run.log").exists()]
        if runs and text in (runs[0] / "run.log").read_text(encoding="utf-8"):
            return runs[0]
        assert process.poll() is None, f"the run ended first: {process.communicate()}"
        assert time.monotonic() < deadline, f"'{text}' never reached run.log"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("reference")
    # The pipeline of the stopped runs, never held (no marker file).
    config = toy_config(folder, held=folder / "never", checkpoint_interval=3)
    return torchloom.train(config, expdir=str(folder / "runs")).run_dir


def test_killed_during_validation_after_saving_the_last_partial_batch(
    tmp_path: Path, reference: Path
) -> None:
    # last.pt is saved after episode 3, the epoch's last batch (8 of 16 samples), then
    # validation starts: a SIGKILL there left a last.pt no resume could start from.
    expdir = tmp_path / "runs"
    held = tmp_path / "held"  # the validation waits until the signal is sent
    held.touch()
    config = toy_config(tmp_path, held=held, checkpoint_interval=3)
    process = start("train", str(config), "--expdir", str(expdir), "--quiet")
    run = wait_for_log(process, expdir, "epoch 1 (episode 3) training")
    process.send_signal(signal.SIGKILL)
    held.unlink()
    process.communicate(timeout=60)
    saved = load_checkpoint(run / "checkpoints" / "last.pt")["progress"]
    assert (saved["epoch"], saved["batch_in_epoch"]) == (0, 3), "killed too late to test"
    assert summary(run)["status"] == "running" and not run_liveness(run).alive
    torchloom.train(resume=run)
    assert summary(run)["status"] == "epoch_limit" and summary(run)["episodes"] == 6
    assert_bit_identical(weights(reference), weights(run))
    for name in ("training_epoch_statistics.csv", "validation_epoch_statistics.csv"):
        assert (run / name).read_text() == (reference / name).read_text(), name


def test_sigterm_during_validation_stops_like_ctrl_c_and_resumes_bit_identically(
    tmp_path: Path, reference: Path
) -> None:
    """SIGTERM (what a scheduler or `kill` sends) is Ctrl-C at every phase: here in the
    validation after epoch 1, as the final test pass below."""
    expdir = tmp_path / "runs"
    held = tmp_path / "held"  # the validation waits until the signal is sent
    held.touch()
    config = toy_config(tmp_path, held=held, checkpoint_interval=3)
    process = start("train", str(config), "--expdir", str(expdir), "--quiet")
    run = wait_for_log(process, expdir, "epoch 1 (episode 3) training")
    process.send_signal(signal.SIGTERM)
    held.unlink()
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    stopped = summary(run)
    assert stopped["status"] == "interrupted" and stopped["episodes"] < 6
    torchloom.train(resume=run)
    assert summary(run)["status"] == "epoch_limit" and summary(run)["episodes"] == 6
    assert_bit_identical(weights(reference), weights(run))


@pytest.mark.parametrize("nohup", [False, True], ids=["terminal", "nohup"])
def test_a_closed_terminal_stops_a_run_as_ctrl_c_does_unless_under_nohup(
    tmp_path: Path, nohup: bool
) -> None:
    """SIGHUP (a closed terminal or SSH session) killed the run unsaved; it now stops it as
    Ctrl-C does. A command started to ignore it (`nohup loom train ...`) goes on."""
    expdir = tmp_path / "runs"
    process = subprocess.Popen(
        [*LOOM, "train", str(toy_config(tmp_path)), "--expdir", str(expdir), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        # nohup ignores SIGHUP before it starts the command; a terminal's shell does not (and
        # this test may itself run under nohup, whose ignoring a child inherits)
        preexec_fn=lambda: signal.signal(
            signal.SIGHUP, signal.SIG_IGN if nohup else signal.SIG_DFL
        ),
    )
    run = wait_for_log(process, expdir, "epoch 1 (episode 3) training")
    process.send_signal(signal.SIGHUP)
    _, stderr = process.communicate(timeout=60)
    assert "Traceback" not in stderr
    if nohup:
        assert process.returncode == 0, stderr
        assert summary(run)["status"] == "epoch_limit"
    else:
        assert process.returncode == 130, stderr
        stopped = summary(run)
        assert stopped["status"] == "interrupted" and "SIGHUP" in stopped["reason"]
        assert (run / "checkpoints" / "last.pt").is_file()


def test_sigterm_during_the_final_test_pass_is_an_interruption(tmp_path: Path) -> None:
    expdir = tmp_path / "runs"
    # The test pass's first batch (the 3rd evaluation batch: 2 validations of one) waits
    # until the signal is sent.
    held = tmp_path / "held"
    held.touch()
    config = toy_config(tmp_path, held=held, held_from=3)
    process = start("train", str(config), "--expdir", str(expdir), "--quiet")
    run = wait_for_log(process, expdir, "test pass with best.pt")
    process.send_signal(signal.SIGTERM)
    held.unlink()
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    stopped = summary(run)
    assert stopped["status"] == "interrupted" and "final test pass" in stopped["reason"]
    assert "test" not in stopped["final"] and not (run / "test_statistics.csv").exists()
    torchloom.train(resume=run)
    ended = summary(run)
    assert ended["status"] == "epoch_limit" and ended["episodes"] == 6
    assert ended["final"]["test"]["samples"] == 32 and "loss" in ended["final"]["test"]
    assert len((run / "test_statistics.csv").read_text().strip().splitlines()) == 2


def test_an_interrupt_turned_into_another_error_is_still_an_interruption(
    tmp_path: Path,
) -> None:
    """Ctrl-C while the pipeline is built (torch's modules imported) may surface as another
    error (an import it cut short fails with ImportError): the command says interrupted,
    exit 130, not a crash with a traceback."""
    config = toy_config(tmp_path)
    markers = tmp_path / "building"
    markers.mkdir()
    slow = f"  building:\n    type: trust_components:SwallowsInterrupts\n    markers: {markers}\n"
    config.write_text(config.read_text() + slow)  # pipeline: is the config's last section
    process = start("train", str(config), "--expdir", str(tmp_path / "runs"), "--quiet")
    deadline = time.monotonic() + 120
    while not any(markers.iterdir()):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the pipeline was never built"
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "interrupted (where it stopped: ImportError: cannot import name" in stderr
    assert "Traceback" not in stderr


def test_a_second_trainer_on_a_running_run_is_refused_naming_the_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expdir = tmp_path / "runs"
    config = toy_config(tmp_path, terminal_conditions={"epoch_limit": 100})  # ~40 s
    first = start("train", str(config), "--expdir", str(expdir), "--quiet")
    try:
        run = wait_for_log(first, expdir, "validation:")
        liveness = run_liveness(run)
        assert liveness.alive and liveness.pid == first.pid
        second = loom_here(capsys, "train", "--resume", str(run), "--quiet")
        assert second.status == 2, second.err
        assert f"is in use by process {first.pid}" in second.err
        assert "Traceback" not in second.err
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=60)
    assert not run_liveness(run).alive  # the kernel released the lock with the process


# ---- full and read-only disks (a small tmpfs; needs the right to mount one) ----------------
@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a 2 MiB tmpfs needs root (the in-process full-disk test runs)")
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(folder: Path) -> None:
    with open(folder / "filler", "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError:
            pass


def test_a_disk_that_fills_up_is_a_clear_error_and_keeps_the_checkpoint(
    tmp_path: Path, small_disk: Path
) -> None:
    expdir = small_disk / "runs"
    process = start(
        "train",
        str(toy_config(tmp_path, checkpoint_interval=1)),
        "--expdir",
        str(expdir),
        "--quiet",
        "--tensorboard",
        "0",
    )
    run = wait_for_log(process, expdir, "epoch 1 (episode 3) training")
    fill(small_disk)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2, stderr
    assert "Traceback" not in stderr
    assert "No space left on device" in stderr and str(run) in stderr
    load_checkpoint(run / "checkpoints" / "last.pt")  # whole, digest and all
    leftovers = [p.name for p in run.rglob(".*") if p.name != ".lock"]
    assert leftovers == [], leftovers
    assert not run_liveness(run).alive


def test_read_only_folders_are_clear_errors(tmp_path: Path, small_disk: Path) -> None:
    """The refusals are real processes: what an interpreter prints as it exits (a log
    handler flushing into the read-only folder) is part of what the user sees."""
    config = toy_config(tmp_path)
    limit = "training.terminal_conditions.epoch_limit"
    run = torchloom.train(config, [f"{limit}=1"], expdir=str(small_disk / "runs")).run_dir
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    before = (run / "checkpoints" / "last.pt").read_bytes()
    resumed = loom("train", "--resume", str(run), f"{limit}=2")
    assert resumed.returncode == 2 and "Traceback" not in resumed.stderr
    assert "Read-only file system" in resumed.stderr and str(run) in resumed.stderr
    assert (run / "checkpoints" / "last.pt").read_bytes() == before
    fresh = loom("train", str(config), "--expdir", str(small_disk / "elsewhere"), "--quiet")
    assert fresh.returncode == 2 and "Traceback" not in fresh.stderr
    assert "Read-only file system" in fresh.stderr and "elsewhere" in fresh.stderr


def test_a_batch_a_loader_worker_cannot_hand_over_is_a_clear_error_not_a_hang(
    tmp_path: Path,
) -> None:
    """A sample pickle cannot copy: multiprocessing printed the error in the worker and
    dropped the batch, and `loom train` waited for it for ever (a first Ctrl-C only asked
    it to stop at a step's end, which never came). A real process: the command must end."""
    config = toy_config(tmp_path, task={"type": "trust_components:UnsendableSamples"})
    done = loom(
        "train",
        str(config),
        "--expdir",
        str(tmp_path / "runs"),
        "--quiet",
        "training.dataloader.num_workers=1",
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip() == (
        "data error: loader worker 0: a batch: cannot be handed to the run: TypeError: "
        "cannot pickle '_HeldCamera' object: it holds an open camera (every stream of a "
        "sample must be one that pickle can copy, as tensors, numbers and strings are, to "
        "leave a loader worker; or set num_workers: 0)"
    )
