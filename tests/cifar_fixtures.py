"""Tiny CIFAR-10 batches written in the real python-pickle format (cifar-10-batches-py/), for
the CIFAR reader tests and the pipelines that read CIFAR-10 (none of it exists offline)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np

from torchloom.zoo.tasks.cifar import CIFAR10_CLASSES

PER_BATCH, TEST_SIZE = 6, 8


def images(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, 3072), dtype=np.uint8)


def dump(path: Path, value: dict[bytes, Any]) -> None:
    path.write_bytes(pickle.dumps(value, protocol=2))


def write_cifar10(folder: Path) -> Path:
    batches = folder / "cifar-10-batches-py"
    batches.mkdir(parents=True)
    for number in range(1, 6):
        labels = [(number + i) % 10 for i in range(PER_BATCH)]
        dump(
            batches / f"data_batch_{number}",
            {b"data": images(PER_BATCH, number), b"labels": labels, b"batch_label": b"x"},
        )
    dump(batches / "test_batch", {b"data": images(TEST_SIZE, 0), b"labels": list(range(8))})
    names = [name.encode() for name in CIFAR10_CLASSES]
    dump(batches / "batches.meta", {b"label_names": names, b"num_cases_per_batch": PER_BATCH})
    return batches
