"""`load:` — weights from files another pipeline wrote, with key selection and prefix maps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from test_core_handshake import GOOD, config, where

from torchloom.core.pipeline_builder import build_pipeline
from torchloom.errors import ComponentError


def trained_model_weights() -> dict[str, torch.Tensor]:
    return {"linear.weight": torch.full((3, 4), 0.5), "linear.bias": torch.arange(3.0)}


def model_with(load: object) -> torch.nn.Module:
    cfg = config({**GOOD, "model": {**GOOD["model"], "load": load}})
    return build_pipeline(cfg, where).components["model"]


def test_plain_state_dict(tmp_path: Path) -> None:
    torch.save(trained_model_weights(), tmp_path / "w.pt")
    model = model_with(str(tmp_path / "w.pt"))
    assert torch.equal(model.linear.bias, torch.arange(3.0))


def test_key_into_a_checkpoint_like_torchloom_writes(tmp_path: Path) -> None:
    torch.save({"components": {"encoder": trained_model_weights()}, "epoch": 3}, tmp_path / "c.pt")
    model = model_with({"file": str(tmp_path / "c.pt"), "key": "components.encoder"})
    assert torch.equal(model.linear.weight, torch.full((3, 4), 0.5))


def test_prefix_map_and_flat_key_selection(tmp_path: Path) -> None:
    flat = {f"components.big.head.{k}": v for k, v in trained_model_weights().items()}
    save_file(flat, str(tmp_path / "w.safetensors"))
    model = model_with(
        {
            "file": str(tmp_path / "w.safetensors"),
            "key": "components.big",
            "prefix_map": {"head.": ""},
        }
    )
    assert torch.equal(model.linear.bias, torch.arange(3.0))


def test_shape_mismatch_and_missing_keys_are_named(tmp_path: Path) -> None:
    torch.save({"linear.weight": torch.zeros(5, 4)}, tmp_path / "w.pt")
    with pytest.raises(ComponentError) as raised:
        model_with(str(tmp_path / "w.pt"))
    text = str(raised.value)
    assert "weight 'linear.weight' has shape [5, 4]" in text
    assert "lacks 1 weights: linear.bias" in text and "toy.yml@pipeline.model.load" in text


def test_missing_file_and_pickled_code_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ComponentError, match="does not exist"):
        model_with(str(tmp_path / "nope.pt"))
    torch.save({"linear.weight": torch.nn.Linear(4, 3)}, tmp_path / "module.pt")
    with pytest.raises(ComponentError, match="cannot read weights file"):
        model_with(str(tmp_path / "module.pt"))


def test_unknown_load_key_suggests(tmp_path: Path) -> None:
    with pytest.raises(ComponentError, match="did you mean 'prefix_map'"):
        model_with({"file": "x.pt", "prefix_mpa": {}})
