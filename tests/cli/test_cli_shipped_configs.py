"""Every config shipped under configs/ is exercised: each pipeline passes `loom check` as it
is, and each include-only base (`default_*.yml`) is included by one. Pipelines that build
from data that no offline machine has (a vocabulary from CLEVR's questions, GloVe vectors, a
checkpoint of another run) are checked, and trained, by the test named for each below, on
fixtures written in the real formats; this file checks that such a test exists."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from torchloom.cli.main import main

CONFIGS = Path(__file__).resolve().parents[2] / "src" / "torchloom" / "configs"
BASES = sorted(CONFIGS.rglob("default_*.yml"))
PIPELINES = sorted(set(CONFIGS.rglob("*.yml")) - set(BASES))
TESTS = Path(__file__).resolve().parents[1]
# config (relative to configs/) -> the test that checks it with its data
CHECKED_WITH_DATA = {
    "language/translation_seq2seq_attention.yml": "zoo/test_zoo_language_configs.py",
    "vqa/clevr_convnet_lstm_concat.yml": "zoo/test_zoo_vqa_configs.py",
    "vqa/vqa_med_vgg_glove_attention.yml": "zoo/test_zoo_vqa_configs.py",
    "vqa/vqa_med_mcb.yml": "zoo/test_zoo_vqa_configs.py",
    "vqa/vqa_med_mfb.yml": "zoo/test_zoo_vqa_configs.py",
    "transplant/mnist_transplant_encoder.yml": "e2e/test_e2e_multitask_transplant.py",
}
CHECKABLE = [p for p in PIPELINES if str(p.relative_to(CONFIGS)) not in CHECKED_WITH_DATA]


def test_configs_are_shipped_and_linked_from_the_root() -> None:
    assert len(PIPELINES) >= 7 and len(BASES) >= 3
    assert (Path(__file__).resolve().parents[2] / "configs").resolve() == CONFIGS


@pytest.mark.parametrize("config", CHECKABLE, ids=lambda p: str(p.relative_to(CONFIGS)))
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


@pytest.mark.parametrize("config, test", sorted(CHECKED_WITH_DATA.items()))
def test_configs_that_need_data_are_checked_by_their_own_test(config: str, test: str) -> None:
    assert (CONFIGS / config).is_file(), f"{config} is no longer shipped"
    text = (TESTS / test).read_text(encoding="utf-8")
    assert Path(config).stem in text, f"{test} does not check {config}"
