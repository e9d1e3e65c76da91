"""Run folders: `<expdir>/<pipeline name>/<YYYYmmdd_HHMMSS>[_<tag>]/`, created atomically.

`os.mkdir` either creates the folder or fails, so two runs started in the same second can
never share one: the second gets a `-2` suffix (then `-3`, ...). Nothing is ever written
into an existing run folder except by `--resume`, which continues that run.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from torchloom.errors import ConfigError, Problem

if TYPE_CHECKING:  # the run folder module stays torch-free to import
    from torchloom.core.component import Component

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def create_run_folder(
    expdir: str | os.PathLike[str], pipeline_name: str, tag: str = "", now: float | None = None
) -> Path:
    stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(now))
    base = stamp + (f"_{_SAFE.sub('-', tag)}" if tag else "")
    parent = Path(expdir).expanduser() / _SAFE.sub("-", pipeline_name)
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(
            [Problem("", f"--expdir '{expdir}'", f"cannot create it: {error}")]
        ) from error
    for attempt in range(1, 1000):
        folder = parent / (base if attempt == 1 else f"{base}-{attempt}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise ConfigError([Problem("", f"run folder '{parent / base}'", "too many runs in one second")])


def write_text_atomic(path: Path, text: str) -> None:
    """Write through a temporary file and a rename, so a reader never sees half a file."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def write_artifacts(folder: Path, components: Mapping[str, Component]) -> None:
    """Each component's `artifacts()` (vocabularies built from the training data, ...) into
    `folder/artifacts/<component>/`: a run records what its pipeline was built with."""
    for name, component in components.items():
        for file_name, text in component.artifacts().items():
            target = folder / "artifacts" / name
            target.mkdir(parents=True, exist_ok=True)
            write_text_atomic(target / file_name, text)
