"""From an `analysis:` section to hooks: a preset name alone stands for `{preset: NAME}`, in a
YAML config as in `torchloom.Trainer(analysis=...)`."""

from __future__ import annotations

from typing import Any

import pytest

from torchloom.analysis.build import build_hooks
from torchloom.core.globals_store import GlobalsStore
from torchloom.core.pipeline import Pipeline
from torchloom.errors import ConfigError


def hook_names(section: Any) -> list[str]:
    pipeline = Pipeline({}, [], GlobalsStore(), {})
    data = {} if section is None else {"analysis": section}
    return [type(hook).__name__ for hook in build_hooks(data, pipeline, lambda *k: "run.yml")]


def test_a_preset_name_is_the_preset() -> None:
    assert hook_names("minimal") == ["HistoryPlots", "LearningRateRecorder"]
    assert hook_names("minimal") == hook_names({"preset": "minimal"})
    assert hook_names("full") == hook_names({"preset": "full"})
    assert "LayerStatistics" in hook_names("full")
    assert hook_names(None) == hook_names({"preset": "default"}) == hook_names({})


def test_an_unknown_preset_name_is_an_error_on_its_key() -> None:
    with pytest.raises(ConfigError, match=r"run.yml: key 'analysis.preset': Input should be"):
        hook_names("maximal")
