"""Several processes training one run (CPU, gloo, real `loom train` processes through the
elastic launcher): the same result as one process with the same global batch, one run folder,
resume across world sizes, an elastic restart after a worker dies, two "nodes" on this
machine, and clear errors for what cannot start. The one-process runs they are compared
with, and one-process resumes, run in the test's process (`train_here`, `resume_here`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch
from e2e_helpers import LOOM, only_run, summary

import torchloom
from torchloom.analysis.schema import PRESETS
from torchloom.analysis.skipped import read_skipped
from torchloom.cli.main import main
from torchloom.config import dump_config
from torchloom.config_model import usable_cpus
from torchloom.data.process_start import TEMPORARY_FOLDER_MAX
from torchloom.data.rank_shard import RankShard
from torchloom.data.samplers import build_sampler
from torchloom.engine.checkpoint import load_checkpoint
from torchloom.engine.launch import free_port
from torchloom.engine.run_lock import RunLock

TESTS = Path(__file__).resolve().parents[1]
# Every process these tests start inherits OWNER, so that `spawned_workers` finds this test
# process's workers only: other tests may be launching workers at the same time (pytest-xdist).
OWNER = f"TORCHLOOM_TEST_OWNER={os.getpid()}"
ENV = {
    **os.environ,
    "PYTHONUNBUFFERED": "1",
    "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p),
    "TORCHLOOM_TEST_OWNER": str(os.getpid()),
}


# The minimal preset with its items off: no analysis hook.
NO_ANALYSIS = {"preset": "minimal", **dict.fromkeys(PRESETS["minimal"], False)}


def toy_config(
    folder: Path,
    epochs: int = 2,
    size: int = 44,
    strategy: str | None = None,
    training: dict[str, Any] | None = None,
    analysis: Any = None,
    **extra: Any,
) -> Path:
    """44 samples in global batches of 8: the last batch has 4, cut 2 + 2. No dropout, so one
    process and two compute the same steps. `strategy`: training.distributed.strategy;
    `training`: more training keys; `analysis`: the section (PER_SAMPLE for the tests of the
    reports under DDP; by default none without a `strategy`, which spares each run a second
    of figures, and with one the minimal preset's history plots, drawn by rank 0 while the
    others wait); `extra`: more pipeline components. The training samples have ids
    (worst samples), the others not (errors numbered by position in the pass)."""
    config: dict[str, Any] = {
        "name": "toy",
        "training": {
            "task": {"type": "toy_components:ToyTask", "size": size, "indices": True},
            "dataloader": {"batch_size": 8},
            "optimizer": {"type": "SGD", "lr": 0.1},
            "seed": 3,
            "logging_interval": 2,
            "terminal_conditions": {"epoch_limit": epochs},
        },
        # Several batches (the last one of 5), so that loss_min/max/std are over batches.
        "validation": {
            "task": {"type": "toy_components:ToyTask", "size": 21},
            "dataloader": {"batch_size": 8},
        },
        "test": {
            "task": {"type": "toy_components:ToyTask", "size": 16},
            "dataloader": {"batch_size": 8},
        },
        "pipeline": {
            "model": {
                "type": "toy_components:ToyLinear",
                "dropout": 0.0,
                "globals": {"prediction_size": "num_classes"},
            },
            "loss": {"type": "toy_components:ToyLoss"},
            "accuracy": {"type": "AccuracyStatistics"},
            # Accuracy per class: a statistic with counts per group, added across processes.
            "class_accuracy": {
                "type": "AccuracyByGroupStatistics",
                "prefix": "class_accuracy",
                "group_names": ["first", "second", "third"],
                "streams": {"groups": "targets"},
            },
            **extra,
        },
        "analysis": analysis
        if analysis is not None
        else (NO_ANALYSIS if strategy is None else {"preset": "minimal"}),
    }
    if strategy is not None:
        config["training"]["distributed"] = {"strategy": strategy}
    config["training"].update(training or {})
    path = folder / "toy.yml"
    path.write_text(dump_config(config), encoding="utf-8")
    return path


# The default preset, and the projector's points: the first 15 of the 21 validation samples.
# Layer statistics too: under DDP they are the global batch's, as one process measures them.
PER_SAMPLE = {
    "embeddings": {"streams": ["predictions"], "max_samples": 15},
    "layer_statistics": True,
}


def loom(
    *args: str, timeout: int = 240, tmpdir: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`loom ARGS`; `tmpdir`: its TMPDIR (the machine's /tmp is other tests' too)."""
    env = ENV if tmpdir is None else {**ENV, "TMPDIR": str(tmpdir)}
    return subprocess.run(
        [*LOOM, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def train_here(config: Path | str, expdir: Path, *overrides: str) -> Path:
    """A one-process run trained in this test process, as `loom train` without --nproc trains
    it (the same `torchloom.train`): a reference for the launched runs that spares the test
    a process start (torch's imports, 5 s of CPU here). Its run folder."""
    return torchloom.train(config, list(overrides), expdir=str(expdir)).run_dir


def resume_here(run: Path, *overrides: str) -> str:
    """`loom train --resume RUN OVERRIDES` with one process, in this test process: how the
    run ended."""
    return torchloom.train(resume=run, overrides=list(overrides)).status


def weights(run: Path) -> dict[str, torch.Tensor]:
    return dict(load_checkpoint(run / "checkpoints" / "last.pt")["components"]["model"])


def assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    for key, tensor in a.items():
        assert torch.allclose(tensor, b[key], atol=1e-5), f"{key} differs"


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("one")
    return train_here(toy_config(folder, analysis=PER_SAMPLE), folder / "runs")


def test_rank_shards_together_are_the_global_batches() -> None:
    sampler = build_sampler(None, 21, seed=5, shuffle=True)
    sampler.set_epoch(2)
    order = list(sampler)
    shards = [RankShard(sampler, 8, rank, 2, drop_last=False) for rank in range(2)]
    parts = [list(shard) for shard in shards]
    assert [len(shard) for shard in shards] == [len(part) for part in parts] == [11, 10]
    # global batch k is rank 0's k-th share followed by rank 1's
    assert parts[0][:4] + parts[1][:4] == order[:8]
    assert parts[0][8:] + parts[1][8:] == order[16:]  # the last batch of 5: 3 + 2
    assert sorted(parts[0] + parts[1]) == list(range(21))


def test_two_processes_train_what_one_trains(tmp_path: Path, one_process: Path) -> None:
    # A TMPDIR too deep for the loader workers' sockets, as pytest's 100th temporary folder
    # made it by one byte: their first batch was dropped and the run hung.
    temporary = tmp_path / ("t" * max(3, TEMPORARY_FOLDER_MAX - len(str(tmp_path))))
    temporary.mkdir()
    done = loom(
        "train",
        str(toy_config(tmp_path, analysis=PER_SAMPLE)),
        "--expdir",
        str(tmp_path / "runs"),
        "--quiet",
        "--nproc",
        "2",
        # Loader workers in the launched processes: they died at the first batch (spawned,
        # they had to pickle the task, which holds a lambda).
        "training.dataloader.num_workers=1",
        "validation.dataloader.num_workers=1",
        tmpdir=temporary,
    )
    assert done.returncode == 0, done.stderr
    assert "status: epoch_limit" in done.stdout and "Traceback" not in done.stderr
    # The elastic agent's log folders go with the launch (by default it leaves one in /tmp).
    assert not list(temporary.glob("torchelastic_*"))
    run = only_run(tmp_path / "runs")  # one run folder, written by rank 0
    assert_close(weights(one_process), weights(run))
    two, one = summary(run)["final"], summary(one_process)["final"]
    for section in ("validation", "test"):
        assert two[section]["samples"] == one[section]["samples"]  # every sample once
        for name in ("accuracy", "class_accuracy", *(f"class_accuracy_{n}" for n in CLASSES)):
            assert two[section][name] == one[section][name], name
        # Every loss figure is the batches' own, not the processes' halves of them.
        for name in ("loss", "loss_min", "loss_max", "loss_std"):
            assert two[section][name] == pytest.approx(one[section][name], abs=1e-6), name
    for name in ("accuracy", "class_accuracy_first"):
        assert two["training"][name] == one["training"][name], name
    log = (run / "run.log").read_text()
    assert "2 processes train" in log
    # The reports about every sample of a pass (counts, errors, the worst samples) merge
    # every process's share: the same files as one process writes, never rank 0's half.
    sample_reports = [
        *[f"predictions-{split}-{kind}" for split in ("validation", "test") for kind in KINDS],
        "predictions-training-cm.csv",
        "predictions-training-report.md",
        "worst_samples/worst.csv",
    ]
    assert same_reports(run, one_process, *sample_reports)
    errors = (run / "reports" / "predictions-validation-errors.csv").read_text().splitlines()
    assert len(errors) > 3  # a few misclassified samples, numbered by position in the pass
    assert read_skipped(run) == read_skipped(one_process)  # nothing skipped for the processes
    # The projector's points: the same samples (labels), the same vectors within rounding.
    points = [next(f.glob("tensorboard/*/predictions")) for f in (run, one_process)]
    mine, theirs = ((p / "metadata.tsv").read_text() for p in points)
    assert mine == theirs and len(mine.split()) == 15
    vectors = [numpy.loadtxt(p / "tensors.tsv", delimiter="\t") for p in points]
    assert vectors[0].shape == (15, 3) and numpy.allclose(*vectors, atol=1e-5)
    # Layer statistics were rank 0's share: its gradient (0.127 against 0.081 at episode 1)
    # and its half of the batch's activations.
    layers = [
        numpy.genfromtxt(f / "reports" / "layer_statistics.csv", delimiter=",", names=True)
        for f in (run, one_process)
    ]
    assert len(layers[0]) == len(layers[1]) > 4
    for column in ("episode", "gradient_norm", "activation_mean", "activation_std"):
        assert numpy.allclose(layers[0][column], layers[1][column], atol=1e-5, equal_nan=True)


def test_two_processes_train_what_one_trains_with_a_loss_that_counts_some_targets(
    tmp_path: Path,
) -> None:
    """The global loss weighted each process's mean by its share of the samples, but a loss
    that leaves targets out (ignore_index) is a mean over the targets it counts, which the
    processes hold in other shares: the weights differed by up to 0.08."""
    ignoring = {"loss": {"type": "CrossEntropyLoss", "ignore_index": 0}}
    config = toy_config(tmp_path, **ignoring)
    runs = [train_here(config, tmp_path / "1")]
    done = loom("train", str(config), "--expdir", str(tmp_path / "2"), "--quiet", "--nproc", "2")
    assert done.returncode == 0, done.stderr
    runs.append(only_run(tmp_path / "2"))
    assert_close(weights(runs[0]), weights(runs[1]))
    one, two = (summary(run)["final"] for run in runs)
    assert two["training"]["loss"] == pytest.approx(one["training"]["loss"], abs=1e-6)


KINDS = ("cm.csv", "report.md", "roc.csv", "errors.csv")
CLASSES = ("first", "second", "third")


def same_reports(run: Path, reference: Path, *names: str) -> bool:
    for name in names:
        mine, theirs = (folder / "reports" / name for folder in (run, reference))
        assert mine.read_text() == theirs.read_text(), name
    return True


def test_a_process_with_nothing_to_evaluate_adds_nothing(tmp_path: Path) -> None:
    """A test set of one sample: the second process has no share of it. Under DDP it adds
    nothing to the pass; under FSDP, where each forward pass is a collective, it would have
    to take part, so the config is refused before anything is written."""
    config, expdir = str(toy_config(tmp_path, epochs=1)), tmp_path / "runs"
    one = ["test.task.size=1", "--expdir", str(expdir), "--quiet", "--nproc", "2"]
    done = loom("train", config, *one)
    assert done.returncode == 0, done.stderr[-2000:]
    test = summary(only_run(expdir))["final"]["test"]
    assert test["samples"] == 1 and test["loss_min"] == test["loss_max"] == test["loss"]
    refused = loom("train", config, *one, "+training.distributed.strategy=fsdp")
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "test.dataloader: the pass's last batch has 1 sample(s)" in refused.stderr
    only_run(expdir)  # the refused run wrote no folder


def test_accumulation_under_two_processes_trains_what_one_trains_across_a_resume(
    tmp_path: Path,
) -> None:
    """Windows of 4 over 6 batches an epoch (4 + 2): inside a window each process keeps its
    gradients (DDP's no_sync); a stop inside one (the episode limit at 7) saves their mean,
    and the run resumed with both processes ends with the weights of one process."""
    training = {"gradient_accumulation": 4}
    config = str(toy_config(tmp_path, training=training))
    one = train_here(config, tmp_path / "one")
    two = ["--expdir", str(tmp_path / "two"), "--quiet", "--nproc", "2"]
    first = loom("train", config, *two, "+training.terminal_conditions.episode_limit=7")
    assert first.returncode == 0, first.stderr[-2000:]
    run = only_run(tmp_path / "two")
    assert summary(run)["episodes"] == 7
    args = ["--quiet", "--nproc", "2", "training.terminal_conditions.episode_limit=12"]
    resumed = loom("train", "--resume", str(run), *args)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert summary(run)["episodes"] == 12
    assert_close(weights(one), weights(run))


def test_a_run_continues_with_another_number_of_processes(
    tmp_path: Path, one_process: Path
) -> None:
    config = str(toy_config(tmp_path, analysis=PER_SAMPLE))
    expdir = str(tmp_path / "runs")
    first = loom(
        "train",
        config,
        "--expdir",
        expdir,
        "--quiet",
        "--nproc",
        "2",
        "training.terminal_conditions.epoch_limit=1",
    )
    assert first.returncode == 0, first.stderr
    run = only_run(tmp_path / "runs")
    assert resume_here(run, "training.terminal_conditions.epoch_limit=2") == "epoch_limit"
    assert summary(run)["episodes"] == 12
    assert_close(weights(one_process), weights(run))
    assert same_reports(run, one_process, "worst_samples/worst.csv")  # two epochs' losses


def test_an_elastic_restart_after_a_worker_dies_resumes_from_last_pt(
    tmp_path: Path, one_process: Path
) -> None:
    killer = {"death": {"type": "trust_components:DiesOnce", "at": 8, "rank": 1}}
    config = toy_config(tmp_path, **killer)
    text = config.read_text().replace(
        "  logging_interval: 2\n", "  logging_interval: 2\n  checkpoint_interval: 1\n"
    )
    config.write_text(text)
    done = loom(
        "train",
        str(config),
        "--expdir",
        str(tmp_path / "runs"),
        "--quiet",
        "--nproc",
        "2",
        "--max-restarts",
        "1",
    )
    assert done.returncode == 0, done.stderr
    run = only_run(tmp_path / "runs")
    assert summary(run)["status"] == "epoch_limit" and summary(run)["episodes"] == 12
    assert "resumed from episode 7" in (run / "run.log").read_text()
    assert_close(weights(one_process), weights(run))


def test_two_nodes_on_one_machine_write_one_run_folder(tmp_path: Path) -> None:
    """Node 1 started before node 0 waits for node 0's rendezvous, quietly (torch's store
    client would print a C++ stack trace at every try), and both train one run."""
    config, expdir = str(toy_config(tmp_path, epochs=1)), str(tmp_path / "runs")
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = []
    for rank in (1, 0):
        flags = ["--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint", endpoint]
        command = [*LOOM, "train", config, "--expdir", expdir, "--quiet", *flags]
        nodes.append(
            subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV
            )
        )
        time.sleep(3.0)  # node 1 tries a closed port meanwhile
    outputs = [node.communicate(timeout=240) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], [err for _, err in outputs]
    assert any("status: epoch_limit" in out for out, _ in outputs)
    assert not any("frame #" in err or "Traceback" in err for _, err in outputs), outputs
    run = only_run(tmp_path / "runs")
    assert summary(run)["status"] == "epoch_limit"
    # The rendezvous, not --node-rank, chose the machine of rank 0 (here the first to join):
    # the other printed nothing at all; it now says where the run folder is.
    assert all(str(run) in out for out, _ in outputs), outputs


def spawned_workers() -> set[int]:
    """PIDs of live processes that multiprocessing's spawn started (launched workers) from a
    command of this test process (their environment has OWNER)."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and b"spawn_main" in (entry / "cmdline").read_bytes()
                and OWNER.encode() in (entry / "environ").read_bytes().split(b"\0")
            ):
                found.add(int(entry.name))
        except OSError:
            continue
    return found


def test_what_cannot_start_is_a_clear_error(tmp_path: Path, one_process: Path) -> None:
    before = spawned_workers()
    config = str(toy_config(tmp_path))
    uneven = loom(
        "train",
        config,
        "--expdir",
        str(tmp_path / "runs"),
        "--quiet",
        "--nproc",
        "2",
        "training.dataloader.batch_size=9",
    )
    assert uneven.returncode == 2, uneven.stderr
    assert "batch_size" in uneven.stderr and "does not divide among 2" in uneven.stderr
    assert "Traceback" not in uneven.stderr
    assert not (tmp_path / "runs").exists()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        busy = loom(
            "train",
            config,
            "--quiet",
            "--nnodes",
            "1",
            "--nproc",
            "2",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            timeout=200,
        )
    assert busy.returncode == 2, (busy.returncode, busy.stderr[-2000:])
    assert "Traceback" not in busy.stderr and f"127.0.0.1:{port}" in busy.stderr
    assert time.monotonic() - started < 60
    held = RunLock(one_process).acquire()
    try:
        taken_run = loom(
            "train",
            "--resume",
            str(one_process),
            "--quiet",
            "--nproc",
            "2",
            "training.terminal_conditions.epoch_limit=3",
        )
    finally:
        held.release()
    assert taken_run.returncode == 2, taken_run.stderr[-2000:]
    assert f"is in use by process {os.getpid()}" in taken_run.stderr
    assert "Traceback" not in taken_run.stderr
    assert spawned_workers() - before == set(), "a worker outlived its command"


def test_the_launch_flags_are_checked_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(toy_config(tmp_path))
    cases = {
        ("--nproc", "0"): "--nproc 0: must be 1 or more",
        ("--nproc", "-1"): "--nproc -1: must be 1 or more",
        ("--nproc", str(usable_cpus() + 1), "--device", "cpu"): (
            f"is more than the {usable_cpus()} CPU cores"
        ),
        ("--nnodes", "0"): "--nnodes 0: must be 1 or more",
        ("--nproc", "2", "--max-restarts", "-1"): "--max-restarts -1: must be 0 or more",
        ("--nproc", "2", "--rdzv-timeout", "0"): "--rdzv-timeout 0: must be 1 or more",
        ("--nproc", "2", "--rdzv-endpoint", "::1:29400"): "an IPv6 address in brackets",
        # Not an address of this machine (TEST-NET-1): the port is not what to change.
        ("--nproc", "2", "--rdzv-endpoint", "192.0.2.1:29400"): "give an address of this machine",
    }
    if not torch.cuda.is_available():
        cases[("--gpu",)] = "--gpu: asks for one process per GPU, but torch sees no CUDA GPU"
    for flags, message in cases.items():
        status = main(["train", config, "--expdir", str(tmp_path / "runs"), "--quiet", *flags])
        err = capsys.readouterr().err
        assert status == 2 and message in err, (flags, err)
    assert not (tmp_path / "runs").exists()


def test_processes_training_on_gpus_are_at_most_the_gpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each process takes a GPU of its own, and a run with no --device trains on a GPU where
    there is one: on a machine with one GPU (made so here), --nproc 2 is refused before
    anything starts, naming --device cpu, where a second process would have failed on a
    GPU that does not exist."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    config = str(toy_config(tmp_path))
    for flags in (["--nproc", "2"], ["--nproc", "2", "--device", "cuda"]):
        status = main(["train", config, "--expdir", str(tmp_path / "runs"), "--quiet", *flags])
        err = capsys.readouterr().err
        assert status == 2 and "--nproc 2: is more than the 1 GPUs of this machine" in err
        assert "--device cpu trains on the CPU" in err
    assert not (tmp_path / "runs").exists()


def alone(tmp_path: Path, node_rank: int) -> subprocess.CompletedProcess[str]:
    """One node of two, the other never started, a rendezvous of 3 s."""
    flags = ["--nnodes", "2", "--node-rank", str(node_rank), "--rdzv-timeout", "3"]
    config, expdir = str(toy_config(tmp_path)), str(tmp_path / "runs")
    endpoint = f"127.0.0.1:{free_port()}"
    return loom("train", config, "--expdir", expdir, "--quiet", "--rdzv-endpoint", endpoint, *flags)


def test_a_rendezvous_no_other_machine_joins_ends_at_its_timeout(tmp_path: Path) -> None:
    started = time.monotonic()
    done = alone(tmp_path, node_rank=0)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "did not all join within --rdzv-timeout 3 s" in done.stderr
    assert time.monotonic() - started < 60
    lonely = alone(tmp_path, node_rank=1)  # node 0 never answers
    assert lonely.returncode == 2, lonely.stderr[-2000:]
    assert "node 0's rendezvous did not answer within --rdzv-timeout 3 s" in lonely.stderr
    assert "Traceback" not in done.stderr + lonely.stderr
    assert "frame #" not in done.stderr + lonely.stderr  # torch's C++ stack traces
    assert not (tmp_path / "runs").exists()


def long_run(tmp_path: Path, **popen: Any) -> tuple[subprocess.Popen[str], Path]:
    """`loom train --nproc 2` of a run far longer than the test, once it has saved last.pt.
    Its temporary files (the launcher's handoff folder) go to tmp_path/tmp, not the
    machine's /tmp: a launcher killed leaves its folder there, and `worker_pid` looks there."""
    config = toy_config(tmp_path, epochs=2000, training={"checkpoint_interval": 1})
    expdir = tmp_path / "runs"
    (tmp_path / "tmp").mkdir()
    command = [*LOOM, "train", str(config), "--expdir", str(expdir), "--quiet", "--nproc", "2"]
    env = {**ENV, "TMPDIR": str(tmp_path / "tmp")}
    process = subprocess.Popen(command, text=True, env=env, **popen)
    deadline = time.monotonic() + 120
    while not list(expdir.glob("*/*/checkpoints/last.pt")):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"no last.pt: exit {process.returncode}")
        time.sleep(0.2)
    time.sleep(1.0)
    return process, expdir


def in_a_session_until_saved(command: list[str], expdir: Path) -> subprocess.Popen[str]:
    """`command --expdir EXPDIR` in a process group of its own, as a terminal's job (a
    Ctrl-C goes to the whole group), once its run has saved last.pt."""
    process = subprocess.Popen(
        [*command, "--expdir", str(expdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        start_new_session=True,
    )
    while not list(expdir.glob("*/*/checkpoints/last.pt")):
        if process.poll() is not None:
            raise AssertionError(process.communicate()[1][-2000:])
        time.sleep(0.1)
    return process


def test_ctrl_c_stops_every_process_and_the_run_resumes_exactly(tmp_path: Path) -> None:
    """As with one process: every worker stops once at the end of its step, saves, and the
    command exits 130 within seconds; `--resume` with as many processes then ends with the
    weights of a run never stopped, bit for bit."""
    before = spawned_workers()
    slow = {"type": "trust_components:SlowInEvaluation", "seconds": 0.1, "in_training": True}
    training = {"checkpoint_interval": 1}
    config = toy_config(tmp_path, epochs=3, training=training, analysis=PER_SAMPLE, slow=slow)
    flags = ["--quiet", "--nproc", "2"]
    whole = loom("train", str(config), "--expdir", str(tmp_path / "whole"), *flags)
    assert whole.returncode == 0, whole.stderr[-2000:]
    expdir = tmp_path / "stopped"
    process = in_a_session_until_saved([*LOOM, "train", str(config), *flags], expdir)
    try:
        assert len(spawned_workers() - before) == 2  # the check below sees what it looks for
        stopped = time.monotonic()
        os.killpg(process.pid, signal.SIGINT)  # mid-epoch: 6 steps an epoch, saved at each
        out, err = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, (process.returncode, err[-2000:])
    assert time.monotonic() - stopped < 20  # not the agent's 30 s wait for its workers
    assert "status: interrupted" in out and "Traceback" not in err
    assert spawned_workers() - before == set(), "a worker outlived its command"
    run = only_run(expdir)
    stopped_at = summary(run)["episodes"]
    assert summary(run)["status"] == "interrupted" and stopped_at < 18
    log = (run / "run.log").read_text()
    assert "interrupted: last.pt saved" in log and "second signal" not in log
    resumed = loom("train", "--resume", str(run), *flags)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from episode {stopped_at}" in (run / "run.log").read_text()
    reference = weights(only_run(tmp_path / "whole"))
    for key, tensor in weights(run).items():
        assert torch.equal(tensor, reference[key]), f"{key} differs"
    # The per-sample losses of the stopped epoch: both processes' went into last.pt.
    assert same_reports(run, only_run(tmp_path / "whole"), "worst_samples/worst.csv")


def test_a_signal_reaching_one_process_in_the_final_test_pass_stops_every_process(
    tmp_path: Path,
) -> None:
    """Rank 1 alone gets SIGTERM in the test pass's first batch (its 7th evaluation call,
    after two validations of 3): both processes stop before the next batch, as one process
    does, and the resumed run tests. The processes' test shares may be uneven, so the pass
    was run to its end and the run said finished, the signal unheard."""
    signals = {"type": "trust_components:SignalsInEvaluation", "at": 7, "rank": 1}
    config = toy_config(tmp_path, signals=signals)
    flags = ["--quiet", "--nproc", "2"]
    stopped = loom("train", str(config), "--expdir", str(tmp_path / "runs"), *flags)
    assert stopped.returncode == 130, stopped.stderr[-2000:]
    assert "Traceback" not in stopped.stderr
    run = only_run(tmp_path / "runs")
    ended = summary(run)
    assert ended["status"] == "interrupted" and "final test pass" in ended["reason"]
    assert "test" not in ended["final"] and not (run / "test_statistics.csv").exists()
    resumed = loom("train", "--resume", str(run), *flags)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    ended = summary(run)
    assert ended["status"] == "epoch_limit" and ended["final"]["test"]["samples"] == 16


def test_a_second_ctrl_c_stops_workers_that_cannot_take_a_signal(tmp_path: Path) -> None:
    """Workers waiting inside collectives (two that do not match) run no Python and never
    see the signals the launcher passes on: two Ctrl-C left the command hanging until a
    kill -9. Here both workers ignore signals."""
    before = spawned_workers()
    deaf = {"type": "trust_components:DeafAfterStep", "at": 2}
    config = toy_config(tmp_path, epochs=2000, training={"checkpoint_interval": 1}, deaf=deaf)
    command = [*LOOM, "train", str(config), "--quiet", "--nproc", "2"]
    process = in_a_session_until_saved(command, tmp_path / "runs")
    try:
        time.sleep(2.0)  # both deaf by now
        asked = time.monotonic()
        os.killpg(process.pid, signal.SIGINT)
        time.sleep(1.0)
        os.killpg(process.pid, signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, (process.returncode, err[-2000:])
    assert time.monotonic() - asked < 30
    deadline = time.monotonic() + 20
    while spawned_workers() - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert spawned_workers() - before == set(), "a worker outlived its command"


def worker_pid(rank: int, tmp_path: Path) -> int:
    """The PID of the worker of `rank` of the `long_run` in tmp_path, from the pid files the
    workers write in their launcher's handoff folder."""
    (path,) = (tmp_path / "tmp").glob(f"torchloom-launch-*/pid-{rank:04d}")
    return int(path.read_text(encoding="utf-8"))


def test_a_worker_killed_by_a_signal_is_named_as_the_first_failure(tmp_path: Path) -> None:
    """A worker killed with SIGKILL records nothing: its peer's "Connection reset by peer"
    was reported as "rank 0 failed first", and summary.json kept gloo's text as the reason."""
    process, expdir = long_run(tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        os.kill(worker_pid(1, tmp_path), signal.SIGKILL)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1, err[-2000:]
    assert "rank 1 failed first" in err and "killed by SIGKILL" in err, err[-2000:]
    run = only_run(expdir)
    assert summary(run)["reason"] == "rank 1: killed by SIGKILL"


def test_workers_whose_launcher_is_killed_save_and_stop(tmp_path: Path) -> None:
    before = spawned_workers()
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    process, expdir = long_run(tmp_path, **quiet)
    process.kill()  # SIGKILL: the launcher says nothing to anyone
    process.wait()
    deadline = time.monotonic() + 60
    while spawned_workers() - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert spawned_workers() - before == set(), "a worker outlived its launcher"
    run = only_run(expdir)
    assert summary(run)["status"] == "interrupted"  # rank 0 saved last.pt and said so
    assert "interrupted: last.pt saved" in (run / "run.log").read_text()


@pytest.mark.parametrize("user_error", [False, True], ids=["internal", "user-error"])
def test_a_failure_on_another_rank_reaches_rank_0s_log(tmp_path: Path, user_error: bool) -> None:
    fails = {"type": "trust_components:FailsAtStep", "at": 3, "rank": 1, "user_error": user_error}
    config, expdir = str(toy_config(tmp_path, fails=fails)), str(tmp_path / "runs")
    # A user error is not restarted: each restart would start a new run folder (only_run
    # below finds one) and say it again.
    restarts = ["--max-restarts", "2"] if user_error else []
    done = loom("train", config, "--expdir", expdir, "--quiet", "--nproc", "2", *restarts)
    said = "refuses step 3" if user_error else "boom at step 3"
    assert done.returncode == (2 if user_error else 1), done.stderr[-2000:]
    assert done.stderr.count(said) == 1, done.stderr  # said once, by the launcher
    assert ("Traceback" in done.stderr) != user_error
    assert "rank 1 failed first" in done.stderr or user_error
    run = only_run(tmp_path / "runs")
    assert summary(run)["status"] == "failed"
    assert summary(run)["reason"].startswith("rank 1: ") and said in summary(run)["reason"]
    assert "failed first on rank 1: " in (run / "run.log").read_text()


def test_torchrun_runs_torchloom_as_a_module(tmp_path: Path) -> None:
    """Three times over: the workers' interpreter teardown, with gloo's threads still alive
    after destroy_process_group, aborted one now and then (SIGABRT: "terminate called without
    an active exception") after a finished run, in about one launch in four here; a worker
    now ends with os._exit once everything is written (engine/distributed.py)."""
    config = str(toy_config(tmp_path, epochs=1))
    (tmp_path / "tmp").mkdir()  # torchrun leaves its log folders in TMPDIR
    for attempt in range(3):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                "2",
                "-m",
                "torchloom",
                "train",
                config,
                "--expdir",
                str(tmp_path / f"runs{attempt}"),
                "--quiet",
            ],
            capture_output=True,
            text=True,
            env={**ENV, "TMPDIR": str(tmp_path / "tmp")},
            timeout=240,
            check=False,
        )
        assert done.returncode == 0, (attempt, done.stderr[-2000:])
        run = only_run(tmp_path / f"runs{attempt}")
        assert summary(run)["status"] == "epoch_limit"
        assert "2 processes train" in (run / "run.log").read_text()
        assert "test accuracy" in done.stdout  # rank 0's report, written before it ended


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_starts_one_process_per_visible_gpu(tmp_path: Path) -> None:
    """`--gpu`: one launched process per GPU, each on its own; with several GPUs they join over
    NCCL (the lent machines have one, so NCCL itself cannot be shown there: one process, no
    process group, trains on cuda:0)."""
    before = spawned_workers()
    done = loom(
        "train",
        str(toy_config(tmp_path, epochs=1)),
        "--expdir",
        str(tmp_path / "runs"),
        "--gpu",
        "--quiet",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    run = only_run(tmp_path / "runs")
    assert summary(run)["status"] == "epoch_limit"
    assert summary(run)["device"].startswith("cuda")
    gpus = torch.cuda.device_count()
    if gpus > 1:
        assert f"{gpus} processes train" in (run / "run.log").read_text()
    assert spawned_workers() - before == set(), "a worker outlived its command"


# ---- FSDP2 and sharded checkpoints -----------------------------------------------------------
def shard_folders(run: Path) -> set[str]:
    return {f"shards/{p.name}" for p in (run / "checkpoints" / "shards").iterdir()}


def named_shards(run: Path) -> set[str]:
    """The shard folders last.pt and last.prev.pt name (their `sharded` records)."""
    named = set()
    for name in ("last.pt", "last.prev.pt"):
        path = run / "checkpoints" / name
        if path.exists():
            named.add(torch.load(path, weights_only=True)["sharded"]["folder"])
    return named


def test_fsdp_two_processes_train_what_one_trains(tmp_path: Path, one_process: Path) -> None:
    expdir = tmp_path / "runs"
    done = loom(
        "train",
        str(toy_config(tmp_path, strategy="fsdp")),
        "--expdir",
        str(expdir),
        "--quiet",
        "--nproc",
        "2",
        "--tensorboard",
        "2",  # histograms gather the sharded weights and gradients: every process takes part
    )
    assert done.returncode == 0, done.stderr
    run = only_run(expdir)
    assert any((run / "tensorboard").iterdir())
    assert "FSDP2 fully_shard: model" in (run / "run.log").read_text()
    last = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert last["components"] is None and last["optimizer"] is None  # in the shards
    assert shard_folders(run) == named_shards(run)  # older shard folders are removed
    assert_close(weights(one_process), weights(run))  # read from the shards by one process
    two, one = summary(run)["final"], summary(one_process)["final"]
    for section in ("validation", "test"):
        for name in ("accuracy", "class_accuracy", *(f"class_accuracy_{n}" for n in CLASSES)):
            assert two[section][name] == one[section][name], name
        assert two[section]["loss"] == pytest.approx(one[section]["loss"], abs=1e-6)
    best = load_checkpoint(run / "checkpoints" / "best.pt")["components"]["model"]
    assert best["linear.weight"].shape == weights(one_process)["linear.weight"].shape  # whole
    processed = loom(
        "process", str(run), "--checkpoint", "last", "--expdir", str(tmp_path / "processed")
    )
    assert processed.returncode == 0, processed.stderr


# Adam (sharded states), clipping over sharded gradients, and gradient accumulation, so that
# a save after episode 3 is mid-window: its gradients are in the shards too.
HARDER = {
    "optimizer": {"type": "Adam", "lr": 0.01},
    "gradient_clipping": {"norm": 0.05},
    "gradient_accumulation": 2,
}


def harder_config(folder: Path, strategy: str) -> Path:
    return toy_config(folder, strategy=strategy, training=HARDER)


def test_fsdp_resumes_with_another_number_of_processes(tmp_path: Path) -> None:
    """2 -> 1 and 1 -> 2 processes, from a save in the middle of an accumulation window: the
    shards (weights, Adam's states, the window's gradients) are read at another world size,
    and the run ends with the weights of an uninterrupted one-process DDP-strategy run. The
    one-process parts run in the test's process (no process group: DCP in-process)."""
    (tmp_path / "reference").mkdir()
    reference = harder_config(tmp_path / "reference", "ddp")
    expected = weights(train_here(reference, tmp_path / "reference" / "runs"))
    limit = "training.terminal_conditions.episode_limit"
    for first, then in (("2", "1"), ("1", "2")):
        folder = tmp_path / f"{first}to{then}"
        folder.mkdir()
        config, expdir = harder_config(folder, "fsdp"), folder / "runs"
        if first == "1":
            run = train_here(config, expdir, f"+{limit}=3")
        else:
            launch = ["--expdir", str(expdir), "--quiet", "--nproc", first]
            started = loom("train", str(config), *launch, f"+{limit}=3")
            assert started.returncode == 0, started.stderr
            run = only_run(expdir)
        saved = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["sharded"]
        assert saved["optimizer"] and saved["gradients"]  # Adam's states, a window's gradients
        if then == "1":
            assert resume_here(run, f"{limit}=12") == "episode_limit"
        else:
            resumed = loom("train", "--resume", str(run), "--quiet", "--nproc", then, f"{limit}=12")
            assert resumed.returncode == 0, resumed.stderr
        assert summary(run)["episodes"] == 12
        assert_close(expected, weights(run))


def test_a_damaged_shard_falls_back_to_last_prev(tmp_path: Path, one_process: Path) -> None:
    """One process with strategy fsdp saves shards too (no process group: DCP in-process);
    a flipped byte in a shard of last.pt makes resume read last.prev.pt and its shards."""
    config = toy_config(tmp_path, strategy="fsdp")
    config.write_text(
        config.read_text().replace("  seed: 3\n", "  seed: 3\n  checkpoint_interval: 4\n")
    )
    limit = "training.terminal_conditions.epoch_limit"
    run = train_here(config, tmp_path / "runs", f"{limit}=1")
    last = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["sharded"]
    shard = run / "checkpoints" / last["folder"] / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert resume_here(run, f"{limit}=2") == "epoch_limit"
    log = (run / "run.log").read_text()
    assert "does not match its SHA-256 digest" in log and "resuming from last.prev.pt" in log
    assert "resumed from episode 4" in log
    assert_close(weights(one_process), weights(run))


def test_fsdp_refuses_analysis_that_would_wait_on_rank_0_alone(tmp_path: Path) -> None:
    config, expdir = toy_config(tmp_path, strategy="fsdp"), tmp_path / "runs"
    statistics = "+analysis.layer_statistics=true"
    done = loom(
        "train", str(config), statistics, "--expdir", str(expdir), "--quiet", "--nproc", "2"
    )
    assert done.returncode == 2, done.stderr
    assert "analysis.layer_statistics" in done.stderr and "FSDP shards" in done.stderr
    assert "Traceback" not in done.stderr and not expdir.exists()
