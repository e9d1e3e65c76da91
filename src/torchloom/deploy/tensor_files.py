"""Tensors written as safetensors files (no pickle: a deployment loads them without running
code) and read back to check: the safetensors export and the weights of the components before
an export's graph (upstream_weights.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from torchloom.core.weights import first_names
from torchloom.errors import DeployError


def tensors_of(state: Mapping[str, Any], prefix: str = "") -> dict[str, torch.Tensor]:
    """The tensors of a state dict (a component's extra state, such as a vocabulary, is not
    one), keys prefixed."""
    return {f"{prefix}{key}": value for key, value in state.items() if torch.is_tensor(value)}


def write_tensors(
    tensors: Mapping[str, torch.Tensor], path: Path, *, aliases: bool = False
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Write `tensors` to `path` (see stored_once) and read them back: what the file holds,
    and the names stored as copies of memory another name shares otherwise than wholly (a
    view), which safetensors' `load_model` counts as unexpected."""
    from safetensors.torch import load_file, save_file

    stored, copies = stored_once(tensors, aliases)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(stored, str(path))
    saved = load_file(str(path))
    differ = [k for k, v in stored.items() if not torch.equal(saved[k], v)]
    if differ:
        message = f"reads back different values for {first_names(differ)}"
        raise DeployError.at("", f"'{path}'", message)
    return saved, copies


def stored_once(
    tensors: Mapping[str, torch.Tensor], aliases: bool = False
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Each memory under one name, as safetensors requires (and the names stored as copies).
    A tied weight's second name is left out (`safetensors.torch.load_model`, or torch's
    `load_state_dict(..., strict=False)`, restores it with the first, as for safetensors' own
    `save_model`), or stored as a copy with `aliases` (every name in the file, for a strict
    load); a tensor that shares memory otherwise (a view) is stored as a copy."""
    kept: dict[str, torch.Tensor] = {}
    copies: list[str] = []
    owners: dict[int, torch.Tensor] = {}
    for key, value in tensors.items():
        value = value.detach()
        # Ties are told by the memory the tensors share where they are (a GPU's included).
        memory = value.untyped_storage().data_ptr() if value.numel() else None
        first = owners.get(memory) if memory is not None else None
        if first is None:
            if memory is not None:
                owners[memory] = value
            kept[key] = value.cpu().contiguous()
        elif not _same_view(first, value):
            kept[key] = value.cpu().clone().contiguous()
            copies.append(key)
        elif aliases:
            kept[key] = value.cpu().clone().contiguous()
    return kept, copies


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.storage_offset(), a.shape, a.stride(), a.dtype) == (
        b.storage_offset(),
        b.shape,
        b.stride(),
        b.dtype,
    )
