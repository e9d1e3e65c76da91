"""Sort-of-CLEVR end to end: the shipped CNN+RN and CNN+MLP pipelines, reduced (small images,
few of them, few epochs; the variant `benchmarks/sort_of_clevr.py --reduced` trains), trained
by `torchloom.train`; the Relation Network must answer the relational questions clearly
better than the MLP, as in the paper's table."""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import ModuleType

import pytest
import torch

import torchloom
from script_modules import load_script
from torchloom.config.overrides import parse_override
from torchloom.engine.checkpoint import save_checkpoint

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "src" / "torchloom" / "configs" / "vqa"
# The RN's relational test accuracy must beat the MLP's by at least this much (absolute;
# measured: 0.700 against 0.499). On 3,000 relational test questions the standard error of
# the difference is about 0.012, so this is a margin of more than ten standard errors. What
# it shows is early: in this budget neither model has learnt to find the object of the asked
# colour (both stay below 0.6 on the non-relational questions; the reference implementation
# needs about 20 epochs of the full task for that); the RN, summing g over object pairs,
# gets its lead mostly from the counting questions (count 0.804 against the MLP's 0.294;
# closest/furthest shape 0.64/0.65 against 0.60/0.61), while the MLP stays at the priors.
MARGIN = 0.15


def benchmark() -> ModuleType:
    """benchmarks/sort_of_clevr.py, whose REDUCED_* overrides this test trains."""
    return load_script(ROOT / "benchmarks" / "sort_of_clevr.py")


def train_one(config: str, overrides: list[str], expdir: str) -> dict[str, float]:
    """One of the two trainings, on one thread (the same floating-point sums on every
    machine); its test statistics."""
    torch.set_num_threads(1)
    run = torchloom.train(CONFIGS / config, overrides, expdir=expdir, analysis=False)
    assert run.status == "epoch_limit"
    return run.statistics["test"]


@pytest.mark.slow
def test_relation_network_beats_mlp_on_relational_questions(tmp_path: Path) -> None:
    reduced = benchmark()
    common = [
        *reduced.REDUCED_COMMON,
        "+training.seed=0",
        "+training.logging_interval=1000",
        # No early stop; best.pt (which the test pass uses) is the best validation accuracy.
        "training.terminal_conditions.early_stopping.patience=1000",
    ]
    start = time.perf_counter()
    # The MLP trains in a process of its own beside the RN (a core each); each generates
    # the data into a folder of its own, the same data from the same seed.
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
        data = f"training.task.data_folder={tmp_path / 'data-mlp'}"
        mlp_run = pool.submit(
            train_one,
            "sort_of_clevr_cnn_mlp.yml",
            [*common, data, *reduced.REDUCED_MLP],
            str(tmp_path / "runs-mlp"),
        )
        data = f"training.task.data_folder={tmp_path / 'data-rn'}"
        rn = train_one(
            "sort_of_clevr_cnn_rn.yml", [*common, data, *reduced.REDUCED_RN], str(tmp_path / "runs")
        )
        mlp = mlp_run.result(timeout=900)
    seconds = time.perf_counter() - start
    message = f"RN {rn}, MLP {mlp}, {seconds:.0f} s"
    print(message)
    assert rn["accuracy_relational"] >= mlp["accuracy_relational"] + MARGIN, message
    # and the shipped pipelines report the accuracy of every question subtype
    assert rn["subtype_accuracy_count"] > mlp["subtype_accuracy_count"], message


def test_init_from_loads_every_component_with_weights(tmp_path: Path) -> None:
    # `--init-from`: a new run whose models start from another run's checkpoint.
    checkpoint = tmp_path / "a run's folder" / "last.pt"
    checkpoint.parent.mkdir()
    weights = {"layer.weight": torch.ones(2, 2), "layer.bias": torch.zeros(2)}
    components = {"encoder": weights, "head": weights, "nllloss": {}, "accuracy": {"seen": 3}}
    save_checkpoint(checkpoint, {"components": components})  # as a run saves it
    overrides = [parse_override(text) for text in benchmark().init_overrides(str(checkpoint))]
    assert [(o.action.value, o.dotted_key, o.value) for o in overrides] == [
        ("+", f"pipeline.{name}.load", {"file": str(checkpoint), "key": f"components.{name}"})
        for name in ("encoder", "head")
    ]
