"""StreamFileExporter: a row per sample, and each tensor stream read back once a batch (on a
GPU, reading sample by sample would make the host wait for the device at every value)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torchloom.zoo.exporters import StreamFileExporter


class ScalarReads(TorchDispatchMode):
    """Counts the tensor-to-Python-number reads (`.item()`, `float()`, `int()`)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func.overloadpacket.__name__ == "_local_scalar_dense":
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_rows_per_sample_from_one_read_of_each_tensor(tmp_path: Path) -> None:
    streams = ["indices", "scores", "labels", "tokens", "vectors"]
    exporter = StreamFileExporter.create(input_streams=streams)
    assert isinstance(exporter, StreamFileExporter)
    exporter.begin_pass("validation", tmp_path)
    batch: dict[str, Any] = {
        "indices": torch.arange(64),
        "scores": torch.arange(128, dtype=torch.float32).view(64, 2) / 4,
        "labels": [f"class {i % 3}" for i in range(64)],
        "tokens": [["the", f"cat {i}"] for i in range(64)],  # a list stream, as Python writes it
        "vectors": [torch.tensor([i, -i]) for i in range(64)],  # tensors in a list stream
    }
    with ScalarReads() as reads:
        exporter(batch)
    exporter.end_pass()
    assert reads.count == 0
    with open(tmp_path / "exported_streams.csv", newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == 64
    assert rows[5] == {
        "indices": "5",
        "scores": "2.5 2.75",
        "labels": "class 2",
        "tokens": "['the', 'cat 5']",
        "vectors": "5 -5",
    }
