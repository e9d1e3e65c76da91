"""Batch assembly: a task's samples built one by one and collated, against `Task.fetch`.

The loaders ask a task for whole batches (`Task.fetch`, through torch's `__getitems__`); a task
that holds its data in tensors builds a batch in a few tensor operations. This measures, for
Sort-of-CLEVR at full size (batches of 64 questions on 75x75 images) or Fashion-MNIST at 32x32
(batches of 256, the GPU throughput benchmark's), the same random batches both ways through a
DataLoader without workers, in alternating rounds, and checks that the two ways give the same
batches. On a GPU the batch is assembled on the host between steps, so its cost adds to every
step (docs/benchmarks.md). Last line prints the median time ratio.

    python benchmarks/input_pipeline.py [--rounds 5] [--batches 200] [--data ~/data/sort_of_clevr]
    python benchmarks/input_pipeline.py --task fashion-mnist [--data ~/data/fashion-mnist]
    python benchmarks/input_pipeline.py --task fashion-mnist --augment   # CIFAR's recipe

`--augment` (Fashion-MNIST) adds random steps, DARTS's CIFAR-10 recipe: a 32x32 crop after
padding 4, a flip with probability 0.5 and a cutout of 16; both ways then draw from torch's
generator, seeded alike before each.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from torch.utils.data import DataLoader

from torchloom.core.component import Batch, Task
from torchloom.engine.loaders import RenamingCollate, TaskBatches
from torchloom.zoo.tasks.fashion_mnist import FashionMNIST
from torchloom.zoo.tasks.sort_of_clevr import SortOfCLEVR

# task: (what it is built from the data folder, default folder, default batch size)
TASKS = {
    "sort-of-clevr": (
        lambda folder, **params: SortOfCLEVR.create(
            split="train", images=9800, data_folder=folder, seed=0, **params
        ),
        "~/data/sort_of_clevr",
        64,
    ),
    "fashion-mnist": (
        lambda folder, **params: FashionMNIST.create(
            split="train", data_folder=folder, resize=[32, 32], **params
        ),
        "~/data/fashion-mnist",
        256,
    ),
}
# Random steps of the CIFAR-10 recipe DARTS trains with (`--augment`).
AUGMENT = {"random_crop": {"size": [32, 32], "padding": 4}, "horizontal_flip": 0.5, "cutout": 16}


def loaders(task: Task, batch_size: int, seed: int) -> dict[str, DataLoader[Any]]:
    """The two ways, over the same shuffled order."""
    per_sample: DataLoader[Any] = DataLoader(
        task,
        batch_size=batch_size,
        shuffle=True,
        collate_fn=task.collate,
        generator=torch.Generator().manual_seed(seed),
    )
    fetched: DataLoader[Any] = DataLoader(
        TaskBatches(task),
        batch_size=batch_size,
        shuffle=True,
        collate_fn=RenamingCollate(task),
        generator=torch.Generator().manual_seed(seed),
    )
    return {"one sample at a time": per_sample, "Task.fetch": fetched}


def timed(loader: DataLoader[Any], batches: int) -> tuple[float, list[Batch]]:
    start = time.perf_counter()
    kept = []
    for index, batch in enumerate(loader):
        if index < 2:
            kept.append(batch)
        if index + 1 == batches:
            break
    return (time.perf_counter() - start) / batches, kept


def same(a: Batch, b: Batch) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="sort-of-clevr")
    parser.add_argument("--data", help="data folder (Sort-of-CLEVR: cache of the splits)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch-size", type=int, help="64 for Sort-of-CLEVR, 256 else")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--augment", action="store_true", help="random steps (Fashion-MNIST)")
    args = parser.parse_args()
    if args.augment and args.task != "fashion-mnist":
        parser.error("--augment is for --task fashion-mnist")
    if args.threads:
        torch.set_num_threads(args.threads)
    build, folder, batch_size = TASKS[args.task]
    task = build(args.data or folder, **({"transforms": AUGMENT} if args.augment else {}))
    task.prepare()  # loads (Sort-of-CLEVR: generates and caches) the split on first use
    batch_size = args.batch_size or batch_size
    times: dict[str, list[float]] = {}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        kept = {}
        for name, loader in loaders(task, batch_size, seed=round_).items():
            torch.manual_seed(round_)  # the same random steps both ways
            seconds, kept[name] = timed(loader, args.batches)
            if round_:
                times.setdefault(name, []).append(seconds)
        first, second = kept.values()
        if not all(same(a, b) for a, b in zip(first, second, strict=True)):
            raise SystemExit("the two ways gave different batches")
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        spread = f"{min(values) * 1e3:.2f}-{max(values) * 1e3:.2f}"
        print(f"{name}: {medians[name] * 1e3:.2f} ms a batch (rounds: {spread} ms)")
    ratio = medians["Task.fetch"] / medians["one sample at a time"]
    print(f"Task.fetch / one sample at a time: {ratio:.3f} (same batches: yes)")


if __name__ == "__main__":
    main()
