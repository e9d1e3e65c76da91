"""Make the DARTS components resolvable by name where the installed torchloom predates them.

The shared virtual environment's editable install registered the entry points of the
pyproject it was installed from; until it is reinstalled, the names this package adds
(`DartsNetwork`, `DartsFixedNetwork`) are registered here the way an installation would,
through a distribution on sys.path, read from pyproject.toml itself. With a current
installation this does nothing."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib

from torchloom.core import catalog

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def entry_points_folder(_nas_entry_points: Path | None) -> Path | None:
    """The folder holding the stand-in registration (for subprocesses' PYTHONPATH), or None."""
    return _nas_entry_points


@pytest.fixture(autouse=True, scope="session")
def _nas_entry_points(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path | None]:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    points = declared[catalog.ENTRY_POINT_GROUP]
    missing = {k: v for k, v in points.items() if k not in catalog.registered_entry_points()}
    if not missing:
        yield None
        return
    folder = tmp_path_factory.mktemp("entry_points")
    info = folder / "torchloom_worktree-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torchloom-worktree\nVersion: 0\n")
    lines = [f"[{catalog.ENTRY_POINT_GROUP}]", *(f"{k} = {v}" for k, v in missing.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    catalog.clear_cache()
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))
        catalog.clear_cache()
