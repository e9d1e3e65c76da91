"""The host's share of a training step, without a GPU: torchloom's step against a hand-written
one when the model costs almost nothing, so that what remains is the loop's own work.

On a GPU a small model's step is bound by the host (docs/benchmarks.md, "On a lent GPU:
figures": torchloom's ResNet-18 step took about 3 ms more than a hand-written one there). This
script shows, on the CPU, the host work that torchloom's loop does and a hand-written loop
does not: a linear classifier on flattened 32x32 Fashion-MNIST images (10,250 weights), batch
256, Adam, in three ways, alternating rounds in this one process, each timed over the same
counted steps after a warm-up and inside the first epoch (no epoch's end in the count):

- torchloom: `torchloom.train` of that pipeline, its loader included;
- hand-written, from the host: the same component and task, its batches read as torchloom's
  loader reads them (the task's `fetch` through a DataLoader), the step written out;
- hand-written, gathered: the same, slicing a tensor that holds the whole split.

It prints each way's time per step and the minor page faults per step (fresh memory pages
the kernel had to give), and the ratio torchloom / hand-written from the host.

    python benchmarks/host_step.py [--data ~/data/fashion-mnist] [--rounds 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from gpu_throughput import StepClock, device_batches, host_batches
from overhead import SEED

from torchloom.api import TrainOptions, prepare_training
from torchloom.config import dump_config
from torchloom.engine.assemble import assemble
from torchloom.engine.checkpoint import seed_everything

BATCH = 256
TASK = {"type": "FashionMNIST", "resize": [32, 32]}
PIPELINE = {
    "flatten": {
        "type": "ReshapeTensor",
        "input_dims": [-1, 1, 32, 32],
        "output_dims": [-1, 1024],
        "streams": {"inputs": "inputs", "outputs": "flat_images"},
        "globals": {"output_size": "flat_size"},
    },
    "classifier": {
        "type": "FeedForwardNetwork",
        "log_softmax": False,
        "streams": {"inputs": "flat_images"},
        "globals": {"input_size": "flat_size", "prediction_size": "num_classes"},
    },
    "loss": {"type": "CrossEntropyLoss"},
    "accuracy": {"type": "AccuracyStatistics"},
}


def write_config(folder: Path, data: str, steps: int) -> Path:
    """The pipeline, trained for `steps` batches of 256 without evaluation."""
    config = {
        "name": "host_step",
        "training": {
            "task": {**TASK, "split": "train", "data_folder": data},
            "dataloader": {"batch_size": BATCH, "shuffle": True, "drop_last": True},
            "optimizer": {"type": "Adam", "lr": 1e-3},
            "seed": SEED,
            "terminal_conditions": {"episode_limit": steps, "epoch_limit": 1000},
        },
        "pipeline": PIPELINE,
    }
    path = folder / "host_step.yml"
    path.write_text(dump_config(config), encoding="utf-8")
    return path


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class FaultClock(StepClock):
    """StepClock, also counting page faults over the counted steps."""

    def after_step(self, *args: Any) -> None:
        super().after_step(*args)
        if self.count == self.warmup:
            self.faults = faults()
        elif self.count == self.steps:
            self.faults = faults() - self.faults


def run_torchloom(config: Path, warmup: int, steps: int) -> tuple[float, float]:
    """(seconds, page faults) per counted step of `torchloom.train`."""
    clock = FaultClock(torch.device("cpu"), warmup, warmup + steps)
    with tempfile.TemporaryDirectory() as expdir:
        options = TrainOptions(expdir=expdir, device="cpu", quiet=True, hooks=[clock])
        prepare_training(config, (), options).run()  # type: ignore[union-attr]  # a fresh run
    if clock.epochs[0] != clock.epochs[1]:
        raise RuntimeError("the counted steps crossed an epoch's end")
    return (clock.ended - clock.started) / steps, clock.faults / steps


def run_by_hand(config: Path, warmup: int, steps: int, from_host: bool) -> tuple[float, float]:
    """(seconds, page faults) per counted step of the step written out."""
    seed_everything(SEED)
    pipeline = assemble(config).pipeline
    classifier = pipeline.components["classifier"]
    task = pipeline.tasks["training"]
    task.prepare()
    cpu = torch.device("cpu")
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]]
    if from_host:
        batches = host_batches(task, BATCH, cpu)
    else:
        everything = task.fetch(list(range(len(task))))
        batches = device_batches(everything["inputs"], everything["targets"], BATCH, cpu)
    optimizer = torch.optim.Adam(classifier.parameters(), lr=1e-3)
    started, faulted = 0.0, 0
    for step in range(warmup + steps):
        images, targets = next(batches)
        logits = classifier({"inputs": images.reshape(-1, 1024)})["predictions"]
        loss = F.cross_entropy(logits, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step + 1 == warmup:
            started, faulted = time.perf_counter(), faults()
    return (time.perf_counter() - started) / steps, (faults() - faulted) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="~/data/fashion-mnist")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=180)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    if args.warmup + args.steps > 55_000 // BATCH:
        parser.error("--warmup and --steps must stay inside the first epoch (214 batches)")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        config = write_config(Path(folder), args.data, args.warmup + args.steps)
        ways: dict[str, Callable[[], tuple[float, float]]] = {
            "torchloom": lambda: run_torchloom(config, args.warmup, args.steps),
            "hand-written, from the host": lambda: run_by_hand(
                config, args.warmup, args.steps, from_host=True
            ),
            "hand-written, gathered": lambda: run_by_hand(
                config, args.warmup, args.steps, from_host=False
            ),
        }
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
        for round_ in range(args.rounds + 1):  # round 0 warms up (imports, first loads)
            names = list(ways) if round_ % 2 else list(reversed(ways))
            for name in names:
                result = ways[name]()
                if round_:
                    results[name].append(result)
    medians = {}
    for name, values in results.items():
        seconds = [s for s, _ in values]
        medians[name] = statistics.median(seconds)
        print(
            f"{name}: {medians[name] * 1e3:.3f} ms a step (rounds "
            f"{min(seconds) * 1e3:.3f}-{max(seconds) * 1e3:.3f}), "
            f"{statistics.median(f for _, f in values):.0f} page faults a step"
        )
    ratio = medians["torchloom"] / medians["hand-written, from the host"]
    print(f"torchloom / hand-written from the host: {ratio:.3f}")


if __name__ == "__main__":
    main()
