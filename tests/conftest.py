"""Shared test set-up: the toy components in tests/toy_components.py are importable as
`toy_components:Class`, exactly as a third-party component would be named in a config."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
