"""A check for tasks that gather batches on a device (`Task.hold_on`, `dataloader.on_device`),
shared by the tasks' tests: without a GPU, the meta device stands in for one (placement and
no read-back); with one, the GPU's batches are compared with the host's as well."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchloom.core.component import Task


def check_batches_held_on_devices(make_task: Callable[[], Task], indices: Sequence[int]) -> None:
    """The batch of `indices` gathered from a task held on the host equals the plain one, with
    the same random draws after it; held on the meta device, which holds no values, every
    tensor of the batch lies there and nothing was read back to the host (that fails on meta;
    on a GPU it would wait for the device at every batch). Single samples stay on the host."""

    def fetched(device: torch.device | None) -> tuple[dict[str, Any], torch.Tensor]:
        task = make_task()
        if device is not None:
            assert task.hold_on(device)
            sample = task[0]
            assert all(v.device.type == "cpu" for v in sample.values() if torch.is_tensor(v))
        torch.manual_seed(11)
        return task.fetch(indices), torch.rand(3)

    expected, after = fetched(None)
    devices = ["cpu", "meta"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        batch, draws = fetched(torch.device(device))
        assert torch.equal(draws, after), device
        assert set(batch) == set(expected)
        for key, value in expected.items():
            if not isinstance(value, torch.Tensor):
                assert batch[key] == value, key
                continue
            assert batch[key].device.type == device, key
            assert (batch[key].dtype, batch[key].shape) == (value.dtype, value.shape), key
            if device != "meta":
                assert torch.equal(batch[key].cpu(), value), (device, key)
