"""A checkpoint that does not fit the pipeline never runs silently on untrained weights:
`loom process --checkpoint` and `load:` match components, weight names and shapes first."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from loom_cli_harness import assert_user_error, run_loom

from torchloom.config import dump_config

TOY: dict[str, Any] = {
    "name": "toy",
    "training": {
        "task": {"type": "toy_components:ToyTask", "size": 24},
        "dataloader": {"batch_size": 8},
        "seed": 1,
        "terminal_conditions": {"epoch_limit": 1},
    },
    "test": {"task": {"type": "toy_components:ToyTask", "size": 16}},
    "pipeline": {
        "model": {
            "type": "toy_components:ToyLinear",
            "globals": {"prediction_size": "num_classes"},
        },
        "loss": {"type": "toy_components:ToyLoss"},
    },
}


def write(folder: Path, config: dict[str, Any], name: str) -> Path:
    path = folder / name
    path.write_text(dump_config(config), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("trained")
    config = write(folder, TOY, "toy.yml")
    import torchloom

    result = torchloom.train(config, expdir=str(folder / "runs"), analysis=False)
    return result.run_dir / "checkpoints" / "last.pt"


def variant(change: Any) -> dict[str, Any]:
    config = copy.deepcopy(TOY)
    change(config)
    return config


def test_a_checkpoint_of_another_pipeline_is_refused(
    tmp_path: Path, trained: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def rename(config: dict[str, Any]) -> None:
        config["pipeline"]["classifier"] = config["pipeline"].pop("model")

    other = write(tmp_path, variant(rename), "other.yml")
    result = run_loom(
        capsys,
        "process",
        str(other),
        "--checkpoint",
        str(trained),
        "--expdir",
        str(tmp_path / "runs"),
    )
    assert_user_error(
        result,
        "holds none of this pipeline's weights",
        "components with weights: classifier",
        "the checkpoint's components: model",
    )
    assert not (tmp_path / "runs").exists(), "a refused pass writes nothing"


def test_a_file_that_is_no_checkpoint_names_its_top_level_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.save({"weights": {"w": torch.zeros(2)}, "epoch": 3}, tmp_path / "plain.pt")
    result = run_loom(
        capsys,
        "process",
        str(write(tmp_path, TOY, "toy.yml")),
        "--checkpoint",
        str(tmp_path / "plain.pt"),
    )
    assert_user_error(result, "is not a torchloom checkpoint", "its top-level keys: epoch, weights")


def test_a_partial_match_is_refused_unless_asked_for(
    tmp_path: Path, trained: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def add_head(config: dict[str, Any]) -> None:
        config["pipeline"]["second"] = {
            "type": "toy_components:ToyLinear",
            "globals": {"prediction_size": "num_classes"},
            "streams": {"predictions": "second_predictions"},
        }

    bigger = write(tmp_path, variant(add_head), "bigger.yml")
    expdir = str(tmp_path / "runs")
    refused = run_loom(
        capsys, "process", str(bigger), "--checkpoint", str(trained), "--expdir", expdir
    )
    assert_user_error(
        refused, "component 'second' (ToyLinear)", "lacks 2 weights", "--checkpoint-strict false"
    )
    allowed = run_loom(
        capsys,
        "process",
        str(bigger),
        "--checkpoint",
        str(trained),
        "--checkpoint-strict",
        "false",
        "--expdir",
        expdir,
    )
    assert allowed.status == 0, allowed.err
    assert "weights of 'second': 0 loaded, 2 not loaded" in allowed.out
    (written,) = (tmp_path / "runs").glob("*/*/test_summary.json")
    weights = json.loads(written.read_text())["weights"]
    assert weights["complete"] is False
    assert weights["components"]["model"]["not_loaded"] == []
    assert sorted(weights["components"]["model"]["loaded"]) == ["linear.bias", "linear.weight"]
    assert weights["components"]["second"]["not_loaded"] == ["linear.bias", "linear.weight"]


def test_a_checkpoint_with_other_shapes_names_the_weight_and_both_shapes(
    tmp_path: Path, trained: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def wider(config: dict[str, Any]) -> None:
        config["pipeline"]["model"]["type"] = "trust_components:WideLinear"

    result = run_loom(
        capsys,
        "process",
        str(write(tmp_path, variant(wider), "wide.yml")),
        "--checkpoint",
        str(trained),
        "--expdir",
        str(tmp_path / "runs"),
    )
    assert_user_error(
        result,
        "component 'model' (WideLinear)",
        "weight 'linear.weight' has shape [3, 4]",
        "but [3, 5] in the component",
    )


def test_load_with_strict_false_still_refuses_a_file_matching_nothing(
    tmp_path: Path, trained: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def load(prefix: str) -> Any:
        def change(config: dict[str, Any]) -> None:
            config["pipeline"]["model"]["load"] = {
                "file": str(trained),
                "key": "components.model",
                "prefix_map": {"linear.": prefix},
                "strict": False,
            }

        return change

    nothing = write(tmp_path, variant(load("encoder.")), "nothing.yml")
    assert_user_error(
        run_loom(capsys, "check", str(nothing)),
        "holds none of its weights",
        "encoder.bias",
        "nothing.yml",
    )
    partial = copy.deepcopy(variant(load("linear.")))
    partial["pipeline"]["model"]["load"]["prefix_map"] = {"linear.bias": "other.bias"}
    checked = run_loom(capsys, "check", str(write(tmp_path, partial, "partial.yml")))
    assert checked.status == 0, checked.err
    assert "load: 1 weights from" in checked.out and "not loaded (strict: false): linear.bias" in (
        checked.out
    )
