"""The Python API's own arguments: torchloom.train and torchloom.process refuse what they
would otherwise ignore or misread."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import torchloom
from torchloom.errors import ConfigError
from toy_runs import toy_config


def test_train_refuses_a_config_with_resume(tmp_path: Path) -> None:
    """`train(config, resume=RUN)` ignored the config and continued the run with its own, as
    if the config had been taken; the CLI refuses the combination, and so does train now."""
    first = torchloom.train(toy_config(epochs=1), expdir=str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        torchloom.train(toy_config(epochs=2), resume=first.run_dir)
    problem = caught.value.problems[0]
    assert problem.subject == "train(config, resume=...)" and "give no config" in problem.message
    assert "overrides" in problem.suggestion


def test_train_takes_one_override_given_as_a_string(tmp_path: Path) -> None:
    """A string is a sequence of characters: `train(cfg, "a=b")` recorded one `# override:`
    line per character."""
    result = torchloom.train(
        toy_config(epochs=1), "training.optimizer.lr=0.05", expdir=str(tmp_path)
    )
    text = (result.run_dir / "config.yaml").read_text()
    assert text.startswith("# override: training.optimizer.lr=0.05\n")
    assert yaml.safe_load(text)["training"]["optimizer"]["lr"] == 0.05
