"""Building pipelines: order, priorities, globals, disable, freeze, renames, params."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_core_handshake import GOOD, config, where

from torchloom.core.pipeline_builder import build_pipeline
from torchloom.errors import ComponentError


def test_execution_order_follows_streams_not_declaration() -> None:
    cfg = config({"loss": GOOD["loss"], "model": GOOD["model"]})
    pipeline = build_pipeline(cfg, where)
    assert list(pipeline.components) == ["model", "loss"]


def test_priority_breaks_ties_but_never_overrides_dependencies() -> None:
    cfg = config(
        {
            "b": {
                "type": "toy_components:Echo",
                "streams": {"x": "inputs", "y": "b_out"},
                "priority": 2,
            },
            "a": {
                "type": "toy_components:Echo",
                "streams": {"x": "inputs", "y": "a_out"},
                "priority": 1,
            },
            "late": {
                "type": "toy_components:Echo",
                "streams": {"x": "b_out", "y": "c_out"},
                "priority": 0,
            },
            **GOOD,
        }
    )
    order = list(build_pipeline(cfg, where).components)
    assert order.index("a") < order.index("b") < order.index("late")


def test_stream_cycle_is_reported_with_its_streams() -> None:
    cfg = config(
        {
            **GOOD,
            "one": {"type": "toy_components:Echo", "streams": {"x": "p", "y": "q"}},
            "two": {"type": "toy_components:Echo", "streams": {"x": "q", "y": "p"}},
        }
    )
    with pytest.raises(ComponentError, match=r"cycle.*one \(reads 'p' from two\)"):
        build_pipeline(cfg, where)


def test_globals_resolve_regardless_of_declaration_order() -> None:
    cfg = config(
        {
            **GOOD,
            "reader": {"type": "toy_components:GlobalReader"},
            "writer": {"type": "toy_components:GlobalWriter", "value": 21},
        }
    )
    pipeline = build_pipeline(cfg, where)
    assert pipeline.globals.get("doubled", "test") == 42


def test_missing_global_names_the_reader_and_suggests() -> None:
    cfg = config(
        {
            **GOOD,
            "model": {
                "type": "toy_components:ToyLinear",
                "globals": {"prediction_size": "num_clases"},
            },
        }
    )
    with pytest.raises(ComponentError) as raised:
        build_pipeline(cfg, where)
    text = str(raised.value)
    assert "needs global 'num_clases' (its 'prediction_size')" in text
    assert "did you mean 'num_classes'" in text


def test_global_conflict_is_an_error_naming_both_publishers() -> None:
    cfg = config(
        {
            **GOOD,
            "writer": {
                "type": "toy_components:GlobalWriter",
                "value": 9,
                "globals": {"value": "num_classes"},
            },
        }
    )
    with pytest.raises(ComponentError, match=r"already as 3 by component 'training.task'"):
        build_pipeline(cfg, where)


def test_same_global_from_two_tasks_is_fine() -> None:
    cfg = config(GOOD)
    cfg["validation"] = {"task": {"type": "toy_components:ToyTask", "size": 5}}
    assert set(build_pipeline(cfg, where).tasks) == {"training", "validation"}


def test_disable_in_config_and_argument() -> None:
    extra = {"copy": {"type": "toy_components:Echo", "streams": {"x": "inputs", "y": "c"}}}
    cfg = config({**GOOD, **extra})
    cfg["pipeline"]["disable"] = ["copy"]
    assert "copy" not in build_pipeline(cfg, where).components
    assert (
        "copy" not in build_pipeline(config({**GOOD, **extra}), where, disable=["copy"]).components
    )


def test_disable_of_unknown_component_suggests() -> None:
    with pytest.raises(ComponentError, match="did you mean 'model'"):
        build_pipeline(config(GOOD), where, disable=["modle"])


def test_freeze_stops_gradients_and_keeps_eval_mode() -> None:
    cfg = config({**GOOD, "model": {**GOOD["model"], "freeze": True}})
    pipeline = build_pipeline(cfg, where)
    model = pipeline.components["model"]
    pipeline.train()
    assert not model.training and not model.dropout.training
    assert all(not p.requires_grad for p in model.parameters())


def test_pipeline_wide_freeze() -> None:
    cfg = config(GOOD)
    cfg["pipeline"]["freeze"] = True
    model = build_pipeline(cfg, where).components["model"]
    assert model.frozen


def test_unknown_parameter_suggests_the_right_one() -> None:
    cfg = config({**GOOD, "model": {**GOOD["model"], "bais": False}})
    with pytest.raises(ComponentError) as raised:
        build_pipeline(cfg, where)
    assert "unknown parameter 'bais' of ToyLinear" in str(raised.value)
    assert "did you mean 'bias'" in str(raised.value)


def test_wrong_parameter_type_and_range() -> None:
    cfg = config(GOOD, size=-1, classes="many")
    with pytest.raises(ComponentError) as raised:
        build_pipeline(cfg, where)
    text = str(raised.value)
    assert "parameter 'size'" in text and "parameter 'classes'" in text


def test_a_component_that_cannot_be_allocated_is_a_clear_error() -> None:
    """torch's allocator refusal, a bare RuntimeError traceback, said as a config problem."""
    huge = {"type": "trust_components:AllocatesAtBuild", "size": 2**52}  # 4 PiB
    with pytest.raises(ComponentError) as raised:
        build_pipeline(config({**GOOD, "huge": huge}), where)
    text = str(raised.value)
    assert "toy.yml@pipeline.huge" in text and "component 'huge' (AllocatesAtBuild)" in text
    assert "needs more memory than this machine has to be built" in text
    assert "lower its sizes" in text


def test_renaming_a_stream_the_component_does_not_have() -> None:
    cfg = config({**GOOD, "model": {**GOOD["model"], "streams": {"imputs": "inputs"}}})
    with pytest.raises(ComponentError, match=r"renames stream 'imputs'.*did you mean 'inputs'"):
        build_pipeline(cfg, where)


def test_task_in_pipeline_and_model_as_task_are_refused() -> None:
    cfg = config({**GOOD, "data": {"type": "toy_components:ToyTask"}})
    with pytest.raises(ComponentError, match="is a task"):
        build_pipeline(cfg, where)
    cfg = config(GOOD)
    cfg["training"]["task"] = {"type": "toy_components:ToyLoss"}
    with pytest.raises(ComponentError, match="is a loss, not a task"):
        build_pipeline(cfg, where)


def test_forward_routes_renamed_streams() -> None:
    cfg = config(
        {
            **GOOD,
            "copy": {"type": "toy_components:Echo", "streams": {"x": "predictions", "y": "copied"}},
        }
    )
    pipeline = build_pipeline(cfg, where)
    task = pipeline.tasks["training"]
    batch = pipeline.rename_task_outputs("training", task.collate([task[0], task[1]]))
    out: dict[str, Any] = pipeline(batch)
    assert torch.equal(out["copied"], out["predictions"])
    assert out["loss"].ndim == 0
