"""Copies of an export folder for the tests of `loom predict` on what a received export may
hold: a sidecar.json edited as a damaged or hostile one would be, and a small input image."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image


def digit_png(folder: Path) -> Path:
    """A black 28x28 grey PNG in `folder`."""
    path = folder / "digit.png"
    Image.fromarray(np.zeros((28, 28), dtype=np.uint8)).save(path)
    return path


def edit_sidecar(folder: Path, edit: Callable[[dict[str, Any]], object]) -> None:
    """`edit` applied to the sidecar.json of the export `folder`, in place."""
    record = json.loads((folder / "sidecar.json").read_text(encoding="utf-8"))
    edit(record)
    (folder / "sidecar.json").write_text(json.dumps(record), encoding="utf-8")


def export_copy(onnx_folder: Path, tmp_path: Path, kind: str | None = None) -> Path:
    """A copy of the export in `tmp_path/onnx`; with `kind`, its first output's kind."""
    copy = tmp_path / "onnx"
    shutil.copytree(onnx_folder, copy)
    if kind is not None:
        edit_sidecar(copy, lambda record: record["outputs"][0].update(kind=kind))
    return copy
