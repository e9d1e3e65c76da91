"""The loaders ask a task for whole batches (`Task.fetch`), in the sampler's order, in the
main process and in workers alike, and rename the streams as the pipeline names them."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from torchloom.config.schema import SectionConfig
from torchloom.core.component import Batch
from torchloom.core.host_copies import host_to_device
from torchloom.engine.loaders import SectionLoader
from torchloom.errors import ConfigError
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


def reservoir_section(size: int = 8, deterministic: bool = True) -> SectionConfig:
    reservoir = {"size": size, "replacement_rate": 0.25, "workers": 1}
    reservoir["deterministic"] = deterministic
    return SectionConfig.model_validate(
        {"task": {}, "dataloader": {"batch_size": 4, "reservoir": reservoir}}
    )


def test_a_reservoir_loader_gives_the_epochs_batches_renamed_and_stops_its_workers() -> None:
    task = ToyTask.create(size=10)
    task._context.stream_names["inputs"] = "vectors"
    loader = SectionLoader("training", task, reservoir_section(), 3, where, reservoir=True)
    try:
        batches = list(loader.epoch(0))
        assert len(batches) == loader.batches_per_epoch() == 3  # the sampler's epoch
        assert all(b["vectors"].shape == (4, 4) and len(b["labels"]) == 4 for b in batches)
        assert len(list(loader.epoch(1, start_batch=2))) == 1
        workers = list(loader.reservoir.processes) if loader.reservoir else []
    finally:
        loader.close()
    assert workers and not any(process.is_alive() for process in workers)


def test_a_resumed_non_deterministic_reservoir_continues_its_stream() -> None:
    """A preempted run resumed again and again trained on the first slice of its data only:
    a non-deterministic reservoir's state was not saved, and each session's stream started
    at the beginning. It continues where the stream stood (only the slots start afresh):
    with one worker, samples arrive in order, so the next batch is the sampler's next."""
    batches = []
    states = []
    for _ in range(2):
        loader = SectionLoader(
            "training",
            ToyTask.create(size=40),
            reservoir_section(deterministic=False),
            3,
            where,
            reservoir=True,
        )
        assert loader.reservoir is not None
        try:
            if states:
                assert "not bit-identical" in str(loader.load_reservoir_state(states[0]))
            loader.reservoir.deliveries = []
            epoch = iter(loader.epoch(0))
            for _ in range(3 if not states else 1):
                batches.append(next(epoch))
            order = loader.reservoir.order(0)
            delivered = list(loader.reservoir.deliveries)
            states.append(loader.reservoir_state())
        finally:
            loader.close()
        if len(states) == 1:
            assert [i for _, i in delivered[:4]] == order[:4]
            first_fresh = loader.reservoir.fresh_delivered
    assert states[0] is not None
    resumed = [i for _, i in delivered]
    assert resumed == order[first_fresh : first_fresh + 4]  # not order[:4] again
    inputs = ToyTask.create(size=40).inputs
    assert torch.equal(batches[-1]["inputs"], inputs[resumed])


def test_batches_for_a_gpu_are_pinned_reservoir_batches_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A copy to a GPU from pageable memory waits for the GPU's queue: a loader for a GPU pins
    its batches by default (an architecture search's second loader, made with the run's
    device alone, included), and batches drawn from a reservoir are pinned too, where they
    were not (pinning needs a GPU: it is recorded here)."""
    section = SectionConfig.model_validate({"task": {}, "dataloader": {"batch_size": 4}})
    for device, pinned in (("cuda", True), ("cpu", False)):
        loader = SectionLoader(
            "training", ToyTask.create(size=10), section, 3, where, device=torch.device(device)
        )
        assert loader.pin_memory is pinned, device
    recorded: list[torch.Tensor] = []

    def pin_memory(self: torch.Tensor) -> torch.Tensor:
        recorded.append(self)
        return self

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    task = ToyTask.create(size=10)
    cuda = torch.device("cuda")
    loader = SectionLoader(
        "training", task, reservoir_section(), 3, where, reservoir=True, device=cuda
    )
    try:
        batch = next(iter(loader.epoch(0)))
    finally:
        loader.close()
    tensors = [value for value in batch.values() if torch.is_tensor(value)]
    assert tensors and all(any(t is r for r in recorded) for t in tensors)


def test_a_run_on_the_host_pins_nothing_even_when_its_config_asks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GPU run's config (`pin_memory: true`, a reservoir) trained or fine-tuned on the host
    (`loom quantize --mode qat` of that run on a laptop): pinning needs a GPU's driver, and a
    reservoir pinned each batch it drew, which failed without one."""

    def pin_memory(self: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("Found no NVIDIA driver on your system")

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    section = reservoir_section()
    section.dataloader.pin_memory = True
    for device in (None, torch.device("cpu")):
        loader = SectionLoader(
            "training", ToyTask.create(size=10), section, 3, where, reservoir=True, device=device
        )
        try:
            assert not loader.pin_memory
            assert torch.is_tensor(next(iter(loader.epoch(0)))["inputs"])
        finally:
            loader.close()


def where(*keys: str) -> str:
    return "cfg.yml:" + ".".join(keys)


@pytest.mark.parametrize(
    ("section_name", "size", "world", "message"),
    [
        ("validation", 8, 1, "is for training only"),
        ("training", 8, 2, "cannot be used by 2 processes"),
    ],
)
def test_a_reservoir_that_cannot_work_is_a_config_error(
    section_name: str, size: int, world: int, message: str
) -> None:
    task = ToyTask.create(size=10)
    config = reservoir_section(size)
    with pytest.raises(ConfigError, match=message) as error:
        SectionLoader(section_name, task, config, 3, where, world=world, reservoir=True)
    assert "dataloader.reservoir" in str(error.value)


def test_a_reservoir_larger_than_its_data_works() -> None:
    """Not refused: the same config trained on a subset of its data (`task.subset=64`, a
    smoke test) would otherwise fail; such a reservoir holds several augmented copies of
    each sample. What bounds a size is the memory it would take (data/reservoir.py)."""
    loader = SectionLoader(
        "training", ToyTask.create(size=10), reservoir_section(size=24), 3, where, reservoir=True
    )
    try:
        assert len(list(loader.epoch(0))) == 3
    finally:
        loader.close()


def test_a_reservoir_smaller_than_a_batch_is_refused_by_the_schema() -> None:
    from torchloom.config.schema import validate_sections

    training = {"task": {}, "dataloader": {"batch_size": 4, "reservoir": {"size": 3}}}
    with pytest.raises(ConfigError, match=r"reservoir\.size 3 is smaller than batch_size 4"):
        validate_sections({"training": training}, where)


class HoldingToyTask(FetchingToyTask):
    """Gathers its batches from the copy of its tensors held on a device, once held."""

    def tensors_to_hold(self) -> dict[str, torch.Tensor]:
        return {"inputs": self.inputs, "targets": self.targets}

    def fetch(self, indices: Sequence[int]) -> Batch:
        tensors = self.held or self.tensors_to_hold()
        positions = host_to_device(torch.tensor(list(indices)), tensors["inputs"].device)
        return {"inputs": tensors["inputs"][positions], "targets": tensors["targets"][positions]}


def on_device_section(**dataloader: object) -> SectionConfig:
    settings = {"batch_size": 4, "on_device": True, **dataloader}
    return SectionConfig.model_validate({"task": {}, "dataloader": settings})


def test_on_device_holds_the_task_on_the_runs_device_and_pins_nothing() -> None:
    task = HoldingToyTask.create(size=10)
    meta = torch.device("meta")  # a device that is not the host, as a GPU would be
    loader = SectionLoader(
        "training", task, on_device_section(), 3, where, pin_memory=True, device=meta
    )
    assert not loader.pin_memory  # the batches are already where they are used
    batches = list(loader.epoch(0))
    assert [b["inputs"].device.type for b in batches] == ["meta"] * 3
    on_host = SectionLoader(
        "validation", HoldingToyTask.create(size=10), on_device_section(), 3, where
    )
    assert next(iter(on_host.epoch(0)))["inputs"].device.type == "cpu"  # no device: the host's


def test_a_task_held_again_on_its_device_keeps_its_copy() -> None:
    """A second loader of the same task (architecture search's) holds no second copy."""
    task = HoldingToyTask.create(size=10)
    assert task.hold_on(torch.device("meta"))
    copy = task.held["inputs"]
    assert task.hold_on(torch.device("meta")) and task.held["inputs"] is copy
    assert task.hold_on(torch.device("cpu")) and task.held["inputs"].device.type == "cpu"
    assert not HoldingToyTask.create(size=10).held  # each task its own


def test_on_device_for_a_task_that_builds_samples_one_by_one_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="builds its samples one by one") as error:
        SectionLoader("training", ToyTask.create(size=10), on_device_section(), 3, where)
    assert "cfg.yml:training.dataloader.on_device" in str(error.value)


def test_data_too_large_for_the_device_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A split larger than the GPU's free memory: the key named, not CUDA's traceback."""

    def out_of_memory(self: HoldingToyTask, device: torch.device) -> bool:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB\nmore")

    monkeypatch.setattr(HoldingToyTask, "hold_on", out_of_memory)
    task = HoldingToyTask.create(size=10)
    with pytest.raises(ConfigError, match="does not fit in the memory of cuda") as error:
        SectionLoader("training", task, on_device_section(), 3, where, device=torch.device("cuda"))
    message = str(error.value)
    assert "cfg.yml:training.dataloader.on_device" in message
    assert "Tried to allocate 20.00 GiB" in message and "more" not in message


@pytest.mark.parametrize(
    ("dataloader", "message"),
    [
        ({"num_workers": 2}, "on_device gathers batches in this process"),
        ({"reservoir": {"size": 8}}, "on_device and reservoir cannot be combined"),
        ({"pin_memory": True}, "on_device leaves nothing to pin"),
    ],
)
def test_on_device_with_workers_is_refused_by_the_schema(
    dataloader: dict[str, object], message: str
) -> None:
    from torchloom.config.schema import validate_sections

    training = {"task": {}, "dataloader": {"batch_size": 4, "on_device": True, **dataloader}}
    with pytest.raises(ConfigError, match=message):
        validate_sections({"training": training}, where)


def test_a_later_k_fold_epoch_whose_last_batch_leaves_a_process_nothing_is_refused() -> None:
    """25 samples in 3 folds (9, 8, 8), batches of 8 over 2 processes: epoch 0 trains 16
    samples (two full batches) and was checked alone; epochs 1 and 2 train 17, a last
    batch of one, and both processes hung in mismatched collectives."""
    from types import SimpleNamespace

    from torchloom.engine.distributed import Distributed, check_shardable

    config = SectionConfig.model_validate(
        {
            "task": {},
            "dataloader": {"batch_size": 8},
            "sampler": {"type": "kfold", "folds": 3},
        }
    )
    two = Distributed(rank=0, world=2, local_rank=0)
    loader = SectionLoader(
        "training", ToyTask.create(size=25), config, 3, lambda *keys: "here", rank=0, world=2
    )
    assert loader.last_batch_size() == 8  # epoch 0's
    with pytest.raises(ConfigError, match="last batch has 1 sample"):
        check_shardable(
            {"training": loader}, SimpleNamespace(statistics=[]), two, lambda *k: "here", "ddp"
        )
