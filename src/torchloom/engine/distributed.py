"""Several processes training one run: torch.distributed's elastic launcher and its process
group, never a home-made one.

`loom train CONFIG --nproc N` starts N worker processes on this machine through
`torch.distributed.launcher.elastic_launch` (the engine torchrun runs on; engine/launch.py);
`--nnodes M --node-rank R --rdzv-endpoint HOST:PORT` joins machines. A process started by
torchrun (`torchrun ... -m torchloom train CONFIG`) finds its rank in the environment. Each
worker trains its share of every global batch (the config's batch size is the global one, so
results do not change meaning with the world size); rank 0 alone writes the run folder.

`Distributed` is what the engine asks: who am I, how many are we, and the few collectives the
loop needs (sums, gathering Python objects). With one process every method is a no-op, so
the single-process loop pays nothing.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import torch

from torchloom.errors import ConfigError, Problem


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` summed over every process (in place; the same tensor back)."""
        if self.active:
            torch.distributed.all_reduce(tensor)
        return tensor

    def gather(self, value: Any) -> list[Any]:
        """Every process's `value` (any picklable object), in rank order, on every process."""
        if not self.active:
            return [value]
        gathered: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(gathered, value)
        return gathered

    def broadcast(self, value: Any) -> Any:
        """Rank 0's `value`, on every process."""
        if not self.active:
            return value
        holder = [value]
        torch.distributed.broadcast_object_list(holder, src=0)
        return holder[0]

    def agree(self, flag: bool) -> bool:
        """True on every process when `flag` is true on any (a stop asked of one process)."""
        if not self.active:
            return flag
        return bool(self.sum(torch.tensor([1.0 if flag else 0.0])).item() > 0)


SINGLE = Distributed()


def current() -> Distributed:
    """The process group this process belongs to, as torch.distributed knows it."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return SINGLE
    local = int(os.environ.get("LOCAL_RANK", "0"))
    return Distributed(torch.distributed.get_rank(), torch.distributed.get_world_size(), local)


def started_by_a_launcher() -> bool:
    """Whether this process is a worker that torchrun or elastic_launch started."""
    return "TORCHELASTIC_RUN_ID" in os.environ or (
        "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ
    )


# Whether this process joined a process group (`join`): its exit must skip the interpreter's
# teardown (`joined_a_group`, cli/main.py).
_joined = False


def joined_a_group() -> bool:
    """Whether this process joined a process group. Such a process ends with os._exit once
    everything is written: gloo's threads outlive destroy_process_group (torch still holds
    the group from C++), and the interpreter's teardown then destroys them in an order that
    now and then aborts the process ("terminate called without an active exception",
    SIGABRT: a failed worker to torchrun, after a run that finished). torch's own launcher
    ends its workers so too (multiprocessing's children end with os._exit)."""
    return _joined


# On GPUs, NCCL for the GPUs' tensors (gradients, losses) and gloo for the host's: NCCL takes
# no CPU tensor, and the loop's stop flags and the Python objects it gathers are on the host
# (torch picks a collective's backend by its tensor's device, and gloo for objects).
BACKENDS = {"cpu": "gloo", "cuda": "cpu:gloo,cuda:nccl"}


def on_gpus(device: str | None) -> bool:
    """Whether processes given `--device` train on GPUs, each on its own: none given is a
    GPU when there is one, as the run itself resolves it (engine/assemble.py)."""
    return device.startswith("cuda") if device is not None else torch.cuda.is_available()


def backend_for(device: str | None) -> str:
    """The process group's backend for the run's `--device`."""
    return BACKENDS["cuda" if on_gpus(device) else "cpu"]


def join(device: str | None) -> Distributed:
    """Join the process group of a launched worker (gloo on the CPU, NCCL and gloo on GPUs,
    one GPU per local process); the single-process context when not launched."""
    if not started_by_a_launcher() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return SINGLE
    if not torch.distributed.is_initialized():
        backend = backend_for(device)
        if backend == BACKENDS["cuda"]:  # before anything touches a GPU: this process's own
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        global _joined
        _joined = True
        if attempt == 0:
            torch.distributed.init_process_group(backend)
        else:
            # After an elastic restart the workers meet on the agent's store again, where
            # the first attempt's addresses still are: a fresh key prefix per attempt keeps
            # a restarted worker from dialling a dead one.
            torch.distributed.init_process_group(
                backend,
                store=torch.distributed.PrefixStore(f"torchloom-attempt-{attempt}", _store()),
                rank=int(os.environ["RANK"]),
                world_size=int(os.environ["WORLD_SIZE"]),
            )
    return current()


def _store() -> Any:
    from datetime import timedelta

    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    return torch.distributed.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=not agent and os.environ.get("RANK") == "0",
        timeout=timedelta(seconds=300),
    )


def leave() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


# ---- set-up of a worker ------------------------------------------------------------------
def process_device(device: torch.device, dist: Distributed) -> torch.device:
    """On GPUs each local process takes its own one."""
    if dist.active and device.type == "cuda":
        return torch.device("cuda", dist.local_rank)
    return device


def check_shardable(
    loaders: dict[str, Any], pipeline: Any, dist: Distributed, where: Any, strategy: str
) -> None:
    """What several processes cannot train exactly, refused before anything is written: an
    epoch whose last global batch has fewer samples than there are processes (one would
    have nothing to train while the others wait for its gradients; under FSDP, where every
    forward pass is a collective, nothing to evaluate either), and a statistic that cannot
    add another process's counts (`Statistic.merge`)."""
    problems = []
    sections = ["training", *(["validation", "test"] if strategy == "fsdp" else [])]
    for section in sections:
        data = loaders.get(section)
        # Of every epoch: a k-fold epoch's length changes with its fold (an epoch after the
        # first ending on a batch of one hung both processes in mismatched collectives).
        last = data.smallest_last_batch() if data is not None else dist.world
        if last < dist.world:
            passes = "epoch's" if section == "training" else "pass's"
            problems.append(
                Problem(
                    where(section, "dataloader"),
                    f"{section}.dataloader",
                    f"the {passes} last batch has {last} sample(s), fewer than the "
                    f"{dist.world} processes"
                    + ("" if section == "training" else " (under FSDP each must evaluate)"),
                    ("set drop_last: true, or " if section == "training" else "set ")
                    + "a batch size or subset that leaves a larger last batch",
                )
            )
    for statistic in pipeline.statistics:
        if not statistic.can_merge:
            problems.append(
                Problem(
                    where("pipeline", statistic.name),
                    statistic.label,
                    "cannot add another process's counts (it has no merge()), so its value "
                    "over a set trained or evaluated by several processes would be wrong",
                    "implement Statistic.merge, or train with one process",
                )
            )
    if problems:
        raise ConfigError(problems)


# Analysis items that run on rank 0 alone but need a model's whole weights or gradients:
# under FSDP they are sharded, and gathering them is a collective rank 0 alone would wait on
# forever. (model_summary skips its side forward pass instead: RunView.sharded_models.)
NOT_UNDER_FSDP = {
    "layer_statistics": "reads per-layer gradients, which FSDP shards among the processes",
}


def check_strategy_hooks(hooks: Any, strategy: str, dist: Distributed, where: Any) -> None:
    """What FSDP with several processes cannot run, refused before anything is written."""
    if strategy != "fsdp" or not dist.active:
        return
    problems = [
        Problem(
            where("analysis", hook.name),
            f"analysis.{hook.name}",
            f"{NOT_UNDER_FSDP[hook.name]}, so it cannot run under "
            "training.distributed.strategy: fsdp with several processes",
            f"disable analysis.{hook.name}, train with strategy: ddp, or with one process",
        )
        for hook in hooks
        if getattr(hook, "name", None) in NOT_UNDER_FSDP
    ]
    if problems:
        raise ConfigError(problems)


def wrap_models(pipeline: Any, device: torch.device, strategy: str = "ddp") -> list[str]:
    """Every model with trainable weights wrapped for several processes: `ddp`,
    DistributedDataParallel around it (frozen parameters are left out by DDP itself; the
    components and their state dicts stay the models' own); `fsdp`, FSDP2's `fully_shard`
    in place (its parameters become DTensors, each process holding a shard: an optimizer
    must be built after this, and checkpoints go through engine/sharded.py)."""
    if strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # The run's device type: fully_shard's default mesh is the machine's accelerator's,
        # which would move a CPU run's shards to a GPU, or a GPU run's to the current GPU.
        mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
        return list(pipeline.wrap_models(lambda model: fully_shard(model, mesh=mesh)))
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return list(pipeline.wrap_models(lambda model: DistributedDataParallel(model, device_ids=ids)))


def gradient_sync(pipeline: Any, sync: bool) -> contextlib.ExitStack:
    """For a step whose backward does not end an accumulation window (`sync` False), DDP's
    `no_sync` of every wrapped model: its gradients stay in each process, added to the
    window's last backward, whose all-reduce takes them (one all-reduce per optimizer step,
    as Lightning does, not one per batch). Nothing to enter when `sync`."""
    stack = contextlib.ExitStack()
    if not sync:
        from torch.nn.parallel import DistributedDataParallel

        for call in pipeline.wrappers():
            if isinstance(call, DistributedDataParallel):
                stack.enter_context(call.no_sync())
    return stack


def average_gradients(parameters: list[torch.nn.Parameter], distributed: Distributed) -> None:
    """The processes' mean of gradients kept by `no_sync` (a save inside an accumulation
    window), in place, in one all-reduce: every process then holds what one process's
    checkpoint keeps, and the window's last all-reduce adds the rest to it."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    flat = distributed.sum(torch.cat([g.reshape(-1) for g in grads]))
    flat /= distributed.world
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor as one process would hold it: a DTensor (FSDP) gathered from every process
    (collective: every process must call it), anything else as it is."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
