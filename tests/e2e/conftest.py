"""End-to-end fixtures: one MNIST data folder per test session (filled from the packaged
original files on first use, as a user's machine without internet would be)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def mnist_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mnist")
