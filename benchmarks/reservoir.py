"""Training throughput when augmentation is slow: the asynchronous reservoir against a plain
DataLoader with the same workers, and against no augmentation at all.

A LeNet-sized convolutional network trains on 28x28 images in batches of 64. The
"augmentation" burns CPU time in the worker (a busy loop, as a real CPU-bound transform
does) calibrated so that augmenting one batch costs `--cost` (default 3) times a training
step measured first. Three ways, one after the other in this process, each timed over the
same number of steps after a warm-up:

    none       a DataLoader with `--workers` workers, no augmentation (the ceiling)
    loader     the same DataLoader with the slow augmentation
    reservoir  torchloom's AsyncReservoir, `--workers` workers, the slow augmentation

The last line prints the reservoir's and the loader's throughput as fractions of `none`'s
(target: reservoir >= 0.90). The reservoir is as fast as its replacement rate lets the
workers keep up: it reuses samples instead of waiting for them (see docs/user-guide.md).

    python benchmarks/reservoir.py [--rounds 3] [--steps 150] [--workers 2] [--cost 3] [--size 512]
        [--rate 0.03] [--sleep]

On a machine whose cores the workers share with the training, CPU-bound augmentation takes
its CPU time from the training whatever the loader: there only a lower replacement rate (less
augmentation work per step) keeps the throughput up. `--sleep` shows the loaders where the
workers do not compete for the training's cores.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from torchloom.data.reservoir import AsyncReservoir

BATCH = 64


class Images(Dataset[dict[str, torch.Tensor]]):
    """Random 28x28 images with 10 classes; `cost` seconds of CPU work per sample."""

    def __init__(self, size: int, cost: float, sleep: bool = False) -> None:
        generator = torch.Generator().manual_seed(0)
        self.images = torch.rand(size, 1, 28, 28, generator=generator)
        self.targets = torch.randint(0, 10, (size,), generator=generator)
        self.cost, self.sleep = cost, sleep

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        image = self.images[index]
        if self.cost and self.sleep:
            time.sleep(self.cost)
        elif self.cost:
            end = time.perf_counter() + self.cost
            while time.perf_counter() < end:  # a CPU-bound transform's time
                pass
            image = torch.flip(image, dims=(2,)) if torch.rand(()) < 0.5 else image
        return {"images": image, "targets": self.targets[index]}


def collate(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.stack([s[key] for s in samples]) for key in samples[0]}


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(400, 120),
        nn.ReLU(),
        nn.Linear(120, 84),
        nn.ReLU(),
        nn.Linear(84, 10),
    )


class Trainer:
    def __init__(self) -> None:
        self.net = model()
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=0.01)

    def step(self, batch: dict[str, torch.Tensor]) -> None:
        loss = nn.functional.cross_entropy(self.net(batch["images"]), batch["targets"])
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def step_seconds(trainer: Trainer, data: Images, steps: int = 30) -> float:
    batch = collate([data[i] for i in range(BATCH)])
    for _ in range(5):
        trainer.step(batch)
    start = time.perf_counter()
    for _ in range(steps):
        trainer.step(batch)
    return (time.perf_counter() - start) / steps


def loader_rate(data: Images, workers: int, steps: int, warmup: int) -> float:
    trainer = Trainer()
    loader = DataLoader(
        data,
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        collate_fn=collate,
        persistent_workers=workers > 0,
        prefetch_factor=4 if workers else None,
    )
    done, start = 0, 0.0
    while done < steps + warmup:
        for batch in loader:
            if done == warmup:
                start = time.perf_counter()
            trainer.step(batch)
            done += 1
            if done == steps + warmup:
                break
    return steps * BATCH / (time.perf_counter() - start)


def reservoir_rate(
    data: Images, workers: int, steps: int, warmup: int, size: int, rate: float
) -> tuple[float, float]:
    """Samples per second, and the fraction of batch samples that were new."""
    trainer = Trainer()

    def order(epoch: int) -> list[int]:
        return torch.randperm(len(data), generator=torch.Generator().manual_seed(epoch)).tolist()

    source = AsyncReservoir(data, order, size=size, replacement_rate=rate, workers=workers, seed=0)
    try:
        for _ in range(warmup):
            trainer.step(source.next_batch(BATCH, collate))
        fresh_before = source.fresh_delivered
        start = time.perf_counter()
        for _ in range(steps):
            trainer.step(source.next_batch(BATCH, collate))
        seconds = time.perf_counter() - start
        new = (source.fresh_delivered - fresh_before) / (steps * BATCH)
    finally:
        source.close()
    return steps * BATCH / seconds, new


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cost", type=float, default=3.0, help="augmentation / training step")
    parser.add_argument("--size", type=int, default=512, help="reservoir size (samples)")
    parser.add_argument("--rate", type=float, default=0.03, help="replacement rate per step")
    parser.add_argument(
        "--sleep",
        action="store_true",
        help="the augmentation waits instead of using the CPU: workers with cores of their own "
        "(or I/O-bound loading), where the workers do not compete with the training",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the workers and the training share the cores fairly
    plain = Images(4096, 0.0)
    step = step_seconds(Trainer(), plain)
    per_sample = args.cost * step / BATCH
    slow = Images(4096, per_sample, args.sleep)
    print(
        f"training step {step * 1e3:.2f} ms (batch {BATCH}); augmentation {per_sample * 1e6:.0f}"
        f" us/sample = {args.cost:g}x a step per batch ({'waiting' if args.sleep else 'CPU'});"
        f" {args.workers} workers"
    )
    rates: dict[str, list[float]] = {"none": [], "loader": [], "reservoir": []}
    news = []
    for _ in range(args.rounds):  # alternating rounds: a shared machine's load hits all three
        rates["none"].append(loader_rate(plain, args.workers, args.steps, args.warmup))
        rates["loader"].append(loader_rate(slow, args.workers, args.steps, args.warmup))
        value, new = reservoir_rate(
            slow, args.workers, args.steps, args.warmup, args.size, args.rate
        )
        rates["reservoir"].append(value)
        news.append(new)
    none, loader, reservoir = (statistics.median(rates[k]) for k in rates)
    new = statistics.median(news)
    print(f"medians of {args.rounds} alternating rounds of {args.steps} steps")
    print(f"{'way':<12}{'samples/s':>12}{'vs none':>10}")
    for name, value in (("none", none), ("loader", loader), ("reservoir", reservoir)):
        print(f"{name:<12}{value:>12.0f}{value / none:>10.2f}")
    print(
        f"reservoir: size {args.size}, replacement_rate {args.rate:g}; "
        f"{100 * new:.0f}% of the samples in its batches were new"
    )
    print(
        f"ratios: reservoir/none {reservoir / none:.2f}, loader/none {loader / none:.2f}, "
        f"reservoir/loader {reservoir / loader:.2f}"
    )


if __name__ == "__main__":
    main()
