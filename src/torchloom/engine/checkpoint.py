"""Checkpoints: everything exact resume needs, written atomically.

A checkpoint is a dict of tensors and plain values (loadable with `weights_only=True`):
component weights by name, optimizer, scheduler, grad scaler, RNG states, progress (epoch,
episode, position in the epoch), early-stopping state and the running statistics. It is
written to a temporary file, flushed to disk, then renamed over the old one: a kill during
a save leaves the previous `last.pt` intact.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from torchloom.errors import DataError, Problem

FORMAT_VERSION = 1


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as handle:
        torch.save({"format": FORMAT_VERSION, **state}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def load_checkpoint(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise DataError(
            [
                Problem(
                    "",
                    f"checkpoint '{path}'",
                    "does not exist",
                    "was the run saved? `ls` its checkpoints/ folder",
                )
            ]
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated or foreign file: a plain message, not a traceback
        raise DataError(
            [Problem("", f"checkpoint '{path}'", f"cannot be read: {error}".splitlines()[0])]
        ) from error
    if not isinstance(state, dict) or state.get("format") != FORMAT_VERSION:
        raise DataError(
            [
                Problem(
                    "",
                    f"checkpoint '{path}'",
                    f"is not a torchloom checkpoint (format {FORMAT_VERSION})",
                )
            ]
        )
    return state
