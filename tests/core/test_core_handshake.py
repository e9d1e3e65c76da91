"""Every handshake rule, on toy components, each asserting the culprit is named."""

from __future__ import annotations

from typing import Any

import pytest

from torchloom.core.handshake import handshake, handshake_problems
from torchloom.core.pipeline_builder import build_pipeline
from torchloom.errors import ComponentError, HandshakeError


def where(*keys: Any) -> str:
    return "toy.yml@" + ".".join(str(k) for k in keys)


def config(pipeline: dict[str, Any], **task: Any) -> dict[str, Any]:
    return {
        "training": {"task": {"type": "toy_components:ToyTask", **task}},
        "pipeline": pipeline,
    }


GOOD = {
    "model": {"type": "toy_components:ToyLinear", "globals": {"prediction_size": "num_classes"}},
    "loss": {"type": "toy_components:ToyLoss"},
}


def problems_of(cfg: dict[str, Any]) -> list[str]:
    return [p.format() for p in handshake_problems(build_pipeline(cfg, where), where)]


def test_a_fitting_graph_passes() -> None:
    handshake(build_pipeline(config(GOOD), where), where)


def test_missing_input_stream_is_named_with_a_suggestion() -> None:
    cfg = config({**GOOD, "model": {**GOOD["model"], "streams": {"inputs": "input"}}})
    (problem,) = problems_of(cfg)
    assert "reads stream 'input' (its 'inputs')" in problem
    assert "did you mean 'inputs'" in problem
    assert "toy.yml@pipeline.model" in problem


def test_symbolic_dimension_bound_by_the_task_is_enforced() -> None:
    cfg = config(
        {**GOOD, "loss": {"type": "toy_components:ToyLoss", "streams": {"predictions": "inputs"}}}
    )
    (problem,) = problems_of(cfg)
    assert "stream 'inputs': dimension 1 ('classes') expected 3, received 4" in problem


def test_rank_mismatch_on_targets() -> None:
    cfg = config(
        {**GOOD, "loss": {"type": "toy_components:ToyLoss", "streams": {"targets": "inputs"}}}
    )
    found = problems_of(cfg)
    assert any("stream 'inputs': expected rank 1" in p and "received rank 2" in p for p in found)


def test_fixed_size_mismatch() -> None:
    # The model is built for width 4 (published by the task) ... then fed width 6 by renaming
    # a second task's output: simplest is a model whose global is renamed to another value.
    cfg = config(GOOD, width=4)
    cfg["pipeline"] = {
        "writer": {
            "type": "toy_components:GlobalWriter",
            "value": 6,
            "globals": {"value": "other_width"},
        },
        "model": {
            **GOOD["model"],
            "globals": {"prediction_size": "num_classes", "input_size": "other_width"},
        },
        "loss": GOOD["loss"],
    }
    (problem,) = problems_of(cfg)
    assert "stream 'inputs': dimension 1 expected 6, received 4" in problem
    assert "component 'model' (ToyLinear)" in problem


def test_symbolic_dimension_must_agree_with_the_task() -> None:
    cfg = config(GOOD, classes=3)
    cfg["pipeline"] = {
        "writer": {"type": "toy_components:GlobalWriter", "value": 5},
        "model": {**GOOD["model"], "globals": {"prediction_size": "value"}},
        "loss": GOOD["loss"],
    }
    found = problems_of(cfg)
    assert any("dimension 'classes' is 5" in p and "but 3" in p for p in found), found


def test_dims_renames_a_symbolic_dimension_for_one_component() -> None:
    # A second head of another size: its `classes` are not the task's, once renamed on it
    # and on its loss; a rename on only one side is still caught, and a misspelt one too.
    cfg = config(GOOD, classes=3)
    second = {
        "writer": {"type": "toy_components:GlobalWriter", "value": 5},
        "head": {
            **GOOD["model"],
            "globals": {"prediction_size": "value"},
            "streams": {"predictions": "other"},
            "dims": {"classes": "other_classes"},
        },
        "other_loss": {
            "type": "toy_components:ToyLoss",
            "streams": {"predictions": "other", "loss": "other_loss"},
            "dims": {"classes": "other_classes"},
        },
    }
    cfg["pipeline"] = {**GOOD, **second}
    assert problems_of(cfg) == []
    del cfg["pipeline"]["other_loss"]["dims"]
    (problem,) = problems_of(cfg)
    assert "dimension 1 ('classes') expected 3, received 5" in problem
    cfg["pipeline"]["other_loss"]["dims"] = {"clases": "other_classes"}
    with pytest.raises(ComponentError, match=r"renames dim 'clases'.*did you mean 'classes'"):
        build_pipeline(cfg, where)


def test_dtype_mismatch() -> None:
    cfg = config(GOOD, target_dtype="float32")
    (problem,) = problems_of(cfg)
    assert "stream 'targets': expected element type int64, received float32" in problem
    assert "ToyLoss" in problem


def test_python_type_stream_into_a_tensor_input() -> None:
    cfg = config(
        {**GOOD, "loss": {"type": "toy_components:ToyLoss", "streams": {"targets": "labels"}}}
    )
    (problem,) = problems_of(cfg)
    assert "expected element type int64, received str" in problem


def test_stream_produced_twice() -> None:
    cfg = config(
        {
            **GOOD,
            "copy": {"type": "toy_components:Echo", "streams": {"x": "inputs", "y": "targets"}},
        }
    )
    (problem,) = problems_of(cfg)
    assert "writes stream 'targets', already produced by training.task (ToyTask)" in problem


def test_training_needs_a_loss() -> None:
    (problem,) = problems_of(config({"model": GOOD["model"]}))
    assert "no loss component" in problem


def test_something_must_be_trainable_unless_all_frozen() -> None:
    cfg = config(
        {
            "loss": GOOD["loss"],
            "copy": {"type": "toy_components:Echo", "streams": {"x": "inputs", "y": "predictions"}},
        }
    )
    cfg["pipeline"]["loss"] = {"type": "toy_components:ToyLoss"}
    found = problems_of(cfg)
    assert any("no component has trainable parameters" in p for p in found)
    frozen = config({**GOOD, "model": {**GOOD["model"], "freeze": True}})
    assert problems_of(frozen) == []


def test_every_problem_is_reported_at_once() -> None:
    cfg = config(
        {
            **GOOD,
            "model": {**GOOD["model"], "streams": {"inputs": "inptus"}},
            "copy": {"type": "toy_components:Echo", "streams": {"x": "labels", "y": "targets"}},
        },
        target_dtype="float32",
    )
    with pytest.raises(HandshakeError) as raised:
        handshake(build_pipeline(cfg, where), where)
    text = str(raised.value)
    assert "3 problems" in text or "4 problems" in text
    assert "inptus" in text and "already produced" in text and "element type" in text


def test_each_section_is_checked_with_its_own_task() -> None:
    cfg = config(GOOD)
    cfg["validation"] = {"task": {"type": "toy_components:ToyTask", "target_dtype": "int32"}}
    (problem,) = problems_of(cfg)
    assert problem.count("[validation]") == 1 and "int32" in problem
