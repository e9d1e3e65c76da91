"""The loaders ask a task for whole batches (`Task.fetch`), in the sampler's order, in the
main process and in workers alike, and rename the streams as the pipeline names them."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from torchloom.config.schema import SectionConfig
from torchloom.core.component import Batch
from torchloom.engine.loaders import SectionLoader
from toy_components import ToyTask


class FetchingToyTask(ToyTask):
    """Builds its batches by indexing its tensors, and marks them so a test can tell."""

    def fetch(self, indices: Sequence[int]) -> Batch:
        positions = torch.tensor(list(indices))
        targets = self.targets[positions]
        return {
            "inputs": self.inputs[positions],
            "targets": targets,
            "labels": [str(t) for t in targets.tolist()],
            "fetched": torch.ones(len(positions), dtype=torch.bool),
        }


def section(workers: int = 0) -> SectionConfig:
    return SectionConfig.model_validate(
        {"task": {}, "dataloader": {"batch_size": 5, "shuffle": True, "num_workers": workers}}
    )


@pytest.mark.parametrize("workers", [0, 1])
def test_loader_batches_come_from_fetch_in_the_sampler_order(workers: int) -> None:
    task = FetchingToyTask.create(size=12)
    task._context.stream_names["inputs"] = "vectors"  # as `streams: {inputs: vectors}` does
    loader = SectionLoader("training", task, section(workers), 3, lambda *keys: "here")
    order = list(loader.sampler)  # the epoch's shuffled order (epoch 0)
    batches = list(loader.epoch(0))
    assert [len(b["targets"]) for b in batches] == [5, 5, 2]
    assert all(bool(b["fetched"].all()) for b in batches)
    # renamed as the pipeline names the stream; the same samples as indexing one by one
    assert "vectors" in batches[0] and "inputs" not in batches[0]
    assert torch.equal(torch.cat([b["vectors"] for b in batches]), task.inputs[order])


def test_the_default_fetch_collates_the_samples() -> None:
    task = ToyTask.create(size=12)
    batch = task.fetch([3, 0, 11])
    assert torch.equal(batch["inputs"], task.inputs[[3, 0, 11]])
    assert batch["labels"] == [task[i]["labels"] for i in (3, 0, 11)]
