"""Components that fit themselves to the training data at build time (vocabularies): they see
the training task, built before them, and leave what they built in the run folder."""

from __future__ import annotations

from pathlib import Path

from test_core_handshake import GOOD, config, where

import torchloom
from torchloom.core.pipeline_builder import build_pipeline
from toy_components import LabelCounter, ToyTask


def test_a_component_sees_the_training_task_whatever_the_declaration_order() -> None:
    # The counter is declared before the task's section would be reached in file order.
    cfg = config({"counter": {"type": "toy_components:LabelCounter"}, **GOOD})
    pipeline = build_pipeline(cfg, where)
    counter = pipeline.components["counter"]
    assert isinstance(counter, LabelCounter)
    task = pipeline.tasks["training"]
    assert isinstance(task, ToyTask)
    expected = {str(int(t)) for t in task.targets}
    assert set(counter.counts) == expected
    assert sum(counter.counts.values()) == len(task)
    assert pipeline.globals.get("distinct_labels", "test") == len(expected)


def test_outside_a_pipeline_there_is_no_training_task() -> None:
    counter = LabelCounter.create()
    assert counter.training_task() is None and counter.counts == {}


def test_artifacts_land_in_the_run_folder(tmp_path: Path) -> None:
    cfg = {
        "training": {
            "task": {"type": "toy_components:ToyTask", "size": 20},
            "terminal_conditions": {"epoch_limit": 1},
        },
        "pipeline": {
            "counter": {"type": "toy_components:LabelCounter"},
            "model": GOOD["model"],
            "loss": {"type": "toy_components:ToyLoss"},
        },
    }
    result = torchloom.train(cfg, expdir=tmp_path, analysis=False)
    written = (result.run_dir / "artifacts" / "counter" / "counts.txt").read_text()
    counts = {line.split()[0]: int(line.split()[1]) for line in written.splitlines()}
    assert sum(counts.values()) == 20
    # `loom process` on the run records them in its own folder too.
    processed = torchloom.process(result.run_dir, section="training")
    assert (processed.folder / "artifacts" / "counter" / "counts.txt").read_text() == written
