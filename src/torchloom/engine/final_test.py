"""The final test pass of a run: the test section evaluated with best.pt's weights (the last
ones where the run has no best.pt), its row in test_statistics.csv, its line in run.log."""

from __future__ import annotations

from typing import Any

from torchloom.core.weights import load_pipeline_weights, match_pipeline_weights
from torchloom.engine import sharded
from torchloom.engine.checkpoint import load_checkpoint
from torchloom.engine.evaluation import evaluate, statistics_copy
from torchloom.engine.reporting import format_statistics
from torchloom.engine.state import Progress, RunSetup, RunView
from torchloom.statistics.csv_log import CsvLog


def run_test_pass(
    setup: RunSetup, progress: Progress, view: RunView, observe: Any
) -> dict[str, float]:
    """The test section's statistics; stops at a signal with PassInterrupted (nothing to
    save: a resumed run repeats it). `observe` sees each batch (the hooks'), or None."""
    assert setup.test_data is not None
    best = load_best_weights(setup)
    setup.log.info("test pass with %s", "best.pt" if best else "the last weights")
    setup.pipeline.check_next_batch("test")
    values = evaluate(
        setup.pipeline,
        setup.test_data.epoch(0),
        statistics_copy(setup.pipeline, setup.device),
        setup.loss,
        setup.precision,
        setup.device,
        observe=observe,
        stop=lambda: setup.signals.by_signal,
        distributed=setup.distributed,
    )
    setup.hooks.after_eval(view, "test", values, False)
    if setup.distributed.main:
        # A pass repeated at the same episode (a run killed after its test pass, resumed)
        # replaces its row instead of adding a second one.
        CsvLog(
            setup.run_dir / "test_statistics.csv", keep_until_episode=progress.episode - 1
        ).write({"epoch": progress.row_epoch, "episode": progress.episode, **values})
    setup.log.info("test: %s", format_statistics(values))
    return values


def load_best_weights(setup: RunSetup) -> bool:
    """Load best.pt's weights into the pipeline for the test pass; False where the run has
    no best.pt (the last weights are tested)."""
    best = setup.run_dir / "checkpoints" / "best.pt"
    if not best.exists():
        return False
    components = load_checkpoint(best)["components"]
    if setup.sharded:
        match_pipeline_weights(setup.pipeline.components, components, f"'{best}'")
        sharded.load_whole(setup.pipeline.registered, components)
    else:
        load_pipeline_weights(setup.pipeline.components, components, f"'{best}'")
    return True
