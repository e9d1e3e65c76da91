"""THP_MEM_ALLOC_ENABLE: set before torch starts, torch puts large CPU tensors on huge pages."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

# torch honours the variable on Linux only.
pytestmark = pytest.mark.skipif(platform.system() != "Linux", reason="torch's THP is Linux's")

PROBE = """
import os
from torchloom.host_memory import prefer_huge_page_tensors, huge_page_tensors_in_effect
{before}
was_set = prefer_huge_page_tensors()
print(was_set, os.environ.get("THP_MEM_ALLOC_ENABLE"), huge_page_tensors_in_effect())
"""


def probe(before: str = "", **environment: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(before=before)],
        env={**env, **environment},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def test_set_before_torch_starts_and_torch_aligns_large_blocks_to_pages() -> None:
    assert probe() == "True 1 True"


def test_a_users_setting_is_kept() -> None:
    assert probe(THP_MEM_ALLOC_ENABLE="0") == "False 0 False"


def test_too_late_once_torch_is_imported() -> None:
    # torch read the environment when it started: setting it now would only mislead.
    assert probe(before="import torch") == "False None False"
