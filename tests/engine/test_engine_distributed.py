"""What a launched worker joins, decided without a GPU: the process group's backend for the
run's device, the GPU it takes, and the device mesh FSDP shards over. (The multi-process runs
themselves are tests/e2e/test_e2e_distributed.py, over gloo.)"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch

from torchloom.engine import distributed

LAUNCHED = {
    "TORCHELASTIC_RUN_ID": "test",
    "RANK": "1",
    "WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "LOCAL_RANK": "1",
    "TORCHELASTIC_RESTART_COUNT": "0",
}


@pytest.fixture
def joining(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """A worker's environment, with torch's process group and GPU calls recorded."""
    calls: list[tuple[str, Any]] = []
    for name, value in LAUNCHED.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: calls.append(("gpu", index)))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(
        torch.distributed, "init_process_group", lambda backend: calls.append(("group", backend))
    )
    monkeypatch.setattr(distributed, "_joined", False)
    monkeypatch.setattr(distributed, "current", lambda: distributed.SINGLE)
    return calls


@pytest.mark.parametrize("device", [None, "cuda", "cuda:0"])
def test_a_worker_on_a_gpu_machine_takes_its_gpu_and_gloo_for_the_hosts_tensors(
    joining: list[tuple[str, Any]], monkeypatch: pytest.MonkeyPatch, device: str | None
) -> None:
    """NCCL takes GPU tensors only, and the loop's stop flag and the objects it gathers are on
    the host: on GPUs the group is NCCL for the GPUs' tensors and gloo for the host's. No
    --device is a GPU where there is one (as the run resolves it), and the worker takes its
    local GPU before anything touches one."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    distributed.join(device)
    assert joining == [("gpu", 1), ("group", "cpu:gloo,cuda:nccl")]


@pytest.mark.parametrize("gpu", [True, False], ids=["a GPU machine", "a CPU machine"])
def test_a_worker_on_the_cpu_joins_gloo(
    joining: list[tuple[str, Any]], monkeypatch: pytest.MonkeyPatch, gpu: bool
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    distributed.join("cpu" if gpu else None)
    assert joining == [("group", "gloo")]


def test_fsdp_shards_over_a_mesh_of_the_run_s_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """fully_shard's default mesh is the machine's accelerator's: on a GPU machine it would put
    a CPU run's shards on a GPU, and every process's on the current GPU. The mesh is made of
    the run's device type, over every process."""
    import torch.distributed.device_mesh as device_mesh
    import torch.distributed.fsdp as fsdp

    meshes: list[tuple[str, tuple[int, ...]]] = []
    sharded: list[Any] = []
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    monkeypatch.setattr(
        device_mesh, "init_device_mesh", lambda kind, shape: meshes.append((kind, shape)) or kind
    )
    monkeypatch.setattr(fsdp, "fully_shard", lambda model, mesh: sharded.append(mesh) or model)

    class Pipeline:
        def wrap_models(self, wrap: Any) -> list[str]:
            wrap(torch.nn.Linear(2, 2))
            return ["model"]

    for device in ("cpu", "cuda:1"):
        assert distributed.wrap_models(Pipeline(), torch.device(device), "fsdp") == ["model"]
    assert meshes == [("cpu", (2,)), ("cuda", (2,))]
    assert sharded == ["cpu", "cuda"]


GROUP_ON_A_GPU = """
import os, torch, torch.distributed as dist
from torchloom.engine.distributed import BACKENDS
from torchloom.engine.launch import free_port
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
torch.cuda.set_device(0)
dist.init_process_group(BACKENDS["cuda"])
flag, loss = torch.tensor([1.0]), torch.tensor([2.0], device="cuda")
dist.all_reduce(flag)  # gloo
dist.all_reduce(loss)  # NCCL
gathered = [None]
dist.all_gather_object(gathered, {"rank": 0})
dist.destroy_process_group()
print("ok", flag.item(), loss.item(), gathered)
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_gpu_process_group_takes_host_and_gpu_tensors() -> None:
    """The backend string of a GPU run, in this torch: a host tensor, a GPU tensor and a
    Python object each go through the one group (a process of its own, world size 1)."""
    done = subprocess.run(
        [sys.executable, "-c", GROUP_ON_A_GPU], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ok 1.0 2.0 [{'rank': 0}]" in done.stdout


def test_a_worker_killed_by_a_signal_is_reported_before_the_peers_it_cut_off() -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from torchloom.engine.launch import Failure, WorkerFailed

    killed = ProcessFailure(local_rank=1, pid=4242, exitcode=-9, error_file="")
    failed = WorkerFailed(ChildFailedError("worker", {1: killed}))
    peer = Failure(0, "RuntimeError: Connection reset by peer", False, "...", 10.0, 0)
    first, second = failed.first_failures([peer])
    assert (first.rank, first.reason) == (1, "killed by SIGKILL") and second is peer
    crashed = ProcessFailure(local_rank=1, pid=4242, exitcode=1, error_file="")
    assert WorkerFailed(ChildFailedError("worker", {1: crashed})).first_failures([peer]) == [peer]


def test_nproc_is_checked_against_the_cpus_this_process_may_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`taskset -c 0 loom train --nproc 2` started two processes on one CPU: the check read
    os.cpu_count(), the machine's, not the process's affinity."""
    from torchloom.engine.launch import LaunchOptions, check_launch
    from torchloom.errors import ConfigError

    if not hasattr(__import__("os"), "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0})
    with pytest.raises(ConfigError, match="more than the 1 CPU cores this process may use"):
        check_launch(LaunchOptions(nproc=2))
    check_launch(LaunchOptions(nproc=1))


class TwinProcesses(distributed.Distributed):
    """Two processes holding the same batch: the all-reduced sum is twice this one's."""

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.mul_(2)


def test_a_batch_whose_every_target_is_ignored_adds_nothing_under_ddp() -> None:
    """With one process the loss of a batch with no counted target is 0 (its mean clamps the
    count); with two, the global mean divided 0 by 0: a NaN loss and NaN gradients, the run
    ended 'diverged' where one process trains on."""
    from types import SimpleNamespace

    from torchloom.engine.step import WeightedLoss
    from torchloom.zoo.losses import CrossEntropyLoss

    loss = CrossEntropyLoss.create(name="loss", ignore_index=-100)
    weighted = WeightedLoss(SimpleNamespace(losses=[loss]), {}, lambda *keys: "config.yml")  # type: ignore[arg-type]
    logits = torch.randn(4, 3, requires_grad=True)
    batch = {"predictions": logits, "targets": torch.full((4,), -100)}
    batch.update(loss(batch))
    assert batch["loss"].item() == 0.0  # one process
    mean, scaled = weighted.across_processes(batch, 4, TwinProcesses(rank=0, world=2))
    assert mean.item() == 0.0 and scaled.item() == 0.0
    scaled.backward()
    assert logits.grad is not None and torch.equal(logits.grad, torch.zeros(4, 3))


def test_a_step_inside_an_accumulation_window_skips_ddp_s_all_reduce() -> None:
    """Every batch's backward all-reduced the gradients, k per optimizer step with an
    accumulation of k: inside a window DDP's no_sync keeps them local, and the window's
    last backward all-reduces their sum (as Lightning accumulates)."""
    from types import SimpleNamespace

    from torch.nn.parallel import DistributedDataParallel

    store = torch.distributed.HashStore()
    torch.distributed.init_process_group("gloo", rank=0, world_size=1, store=store)
    try:
        wrapped = DistributedDataParallel(torch.nn.Linear(3, 2))
        pipeline = SimpleNamespace(wrappers=lambda: [wrapped, torch.nn.Identity()])
        with distributed.gradient_sync(pipeline, sync=False):
            assert not wrapped.require_backward_grad_sync
        assert wrapped.require_backward_grad_sync
        with distributed.gradient_sync(pipeline, sync=True):
            assert wrapped.require_backward_grad_sync
    finally:
        torch.distributed.destroy_process_group()
