"""Small tensors made on the host for one batch (positions, random draws, lengths, weights),
copied to the run's device without making the host wait for it."""

from __future__ import annotations

import torch


def host_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor made for one batch (`checked_positions`, random draws) copied to the
    device it is used on (a held task's, a statistic's): through pinned memory to a GPU, since
    a copy from pageable memory waits for the device's queue, which the host should keep
    ahead of."""
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)
