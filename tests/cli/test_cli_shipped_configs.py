"""Every config shipped under configs/ is exercised: each pipeline passes `loom check` as it
is (no data is read), and each include-only base (`default_*.yml`) is included by one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from torchloom.cli.main import main

CONFIGS = Path(__file__).resolve().parents[2] / "src" / "torchloom" / "configs"
BASES = sorted(CONFIGS.rglob("default_*.yml"))
PIPELINES = sorted(set(CONFIGS.rglob("*.yml")) - set(BASES))


def test_configs_are_shipped_and_linked_from_the_root() -> None:
    assert len(PIPELINES) >= 7 and len(BASES) >= 3
    assert (Path(__file__).resolve().parents[2] / "configs").resolve() == CONFIGS


@pytest.mark.parametrize("config", PIPELINES, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_shipped_pipeline_passes_check(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(config)]) == 0, capsys.readouterr().err
    assert "handshake: ok" in capsys.readouterr().out


@pytest.mark.parametrize("base", BASES, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_base_is_included_by_a_checked_pipeline(base: Path) -> None:
    including = [
        config
        for config in PIPELINES
        if base.name in (yaml.safe_load(config.read_text()) or {}).get("default_configs", [])
        and config.parent == base.parent
    ]
    assert including, f"{base.name} is included by no shipped pipeline"
