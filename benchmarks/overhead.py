"""Framework overhead: LeNet-5 on MNIST through `torchloom.train` versus a hand-written loop.

Both do the same work: the same seed, initial weights, data order (the same sampler),
batch size and optimizer; a full validation pass after every epoch and a test pass at the
end; torchloom with its default logging (CSV rows every 100 batches, TensorBoard scalars,
checkpoints, run.log) and without the analysis hooks (analysis_cost.py measures those).
They run alternately in this one process, after a warm-up, so machine noise hits both alike.
The final weights must be bit-identical. The last line prints the time ratio (target <= 1.03).

    python benchmarks/overhead.py [--epochs 3] [--rounds 2] [--subset N]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import torchloom
from torchloom.core.pipeline import Pipeline
from torchloom.data.samplers import build_sampler
from torchloom.engine.assemble import assemble
from torchloom.engine.checkpoint import seed_everything
from torchloom.engine.loaders import TaskBatches

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "mnist" / "lenet5.yml"
SEED = 1234


def overrides(epochs: int, subset: int | None, data: str) -> list[str]:
    result = [
        f"training.terminal_conditions.epoch_limit={epochs}",
        f"+training.seed={SEED}",
        f"training.task.data_folder={data}",
        "training.terminal_conditions.early_stopping=null",
        "~training.scheduler",  # the hand-written loop keeps a constant rate, so both do
    ]
    if subset:
        result += [f"+training.task.subset={subset}"]
    return result


def run_torchloom(epochs: int, subset: int | None, data: str) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as expdir:
        start = time.perf_counter()
        # The analysis hooks have their own budget (benchmarks/analysis_cost.py): off here.
        result = torchloom.train(
            CONFIG, overrides(epochs, subset, data), expdir=expdir, analysis=False
        )
        elapsed = time.perf_counter() - start
        state = torch.load(result.run_dir / "checkpoints" / "last.pt", weights_only=True)
    return elapsed, state["components"]["image_classifier"]


def _loader(
    pipeline: Pipeline, section: str, batch_size: int, sampler: object = None, seed: int = 0
) -> DataLoader:
    task = pipeline.tasks[section]
    task.prepare()
    # Whole batches from the task's `fetch`, as torchloom's loader reads them: the hand-written
    # loop is given the same fast path (the same batches as sample by sample).
    return DataLoader(
        TaskBatches(task),
        batch_size=batch_size,
        sampler=sampler,
        collate_fn=lambda batch: batch,
        generator=torch.Generator().manual_seed(seed),
    )


def _evaluate(model: torch.nn.Module, loader: DataLoader) -> tuple[float, float]:
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for batch in loader:
            out = model({"inputs": batch["inputs"]})["predictions"]
            total_loss += float(F.nll_loss(out, batch["targets"], reduction="sum"))
            correct += int((out.argmax(1) == batch["targets"]).sum())
            count += len(batch["targets"])
    model.train()
    return total_loss / count, correct / count


def run_by_hand(epochs: int, subset: int | None, data: str) -> tuple[float, dict]:
    """What a researcher would write: a model, an Adam optimizer, a loop, an eval pass."""
    start = time.perf_counter()
    seed_everything(SEED)
    # The same tasks and model classes, so data and initial weights are the same by design.
    pipeline = assemble(CONFIG, overrides(epochs, subset, data)).pipeline
    model = pipeline.components["image_classifier"]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    task = pipeline.tasks["training"]
    task.prepare()
    sampler = build_sampler(None, len(task), seed=SEED, shuffle=True)
    validation = _loader(pipeline, "validation", 256)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        loader = _loader(pipeline, "training", 64, sampler, SEED * 1_000_003 + epoch)
        for batch in loader:
            out = model({"inputs": batch["inputs"]})["predictions"]
            loss = F.nll_loss(out, batch["targets"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        _evaluate(model, validation)
    _evaluate(model, _loader(pipeline, "test", 256))
    return time.perf_counter() - start, {k: v.clone() for k, v in model.state_dict().items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--subset", type=int, default=None, help="training images (default all)")
    parser.add_argument("--data", default="~/data/mnist")
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())  # fixed for the whole run
    run_by_hand(1, 512, args.data)  # warm-up: data files, caches, lazy imports
    run_torchloom(1, 512, args.data)
    loom_times, hand_times = [], []
    for round_ in range(args.rounds):
        first, second = (
            (run_torchloom, run_by_hand) if round_ % 2 == 0 else (run_by_hand, run_torchloom)
        )
        for runner in (first, second):
            elapsed, weights = runner(args.epochs, args.subset, args.data)
            (loom_times if runner is run_torchloom else hand_times).append(elapsed)
            if runner is run_torchloom:
                loom_weights = weights
            else:
                hand_weights = weights
        print(
            f"round {round_ + 1}: torchloom {loom_times[-1]:.2f} s, "
            f"hand-written {hand_times[-1]:.2f} s",
            flush=True,
        )
    identical = loom_weights.keys() == hand_weights.keys() and all(
        torch.equal(loom_weights[k], hand_weights[k]) for k in loom_weights
    )
    loom, hand = statistics.median(loom_times), statistics.median(hand_times)
    print(
        f"epochs {args.epochs}, training images {args.subset or 55000}, "
        f"threads {torch.get_num_threads()}"
    )
    print(f"median torchloom {loom:.2f} s, median hand-written {hand:.2f} s")
    print(f"final weights bit-identical: {identical}")
    print(f"time ratio torchloom / hand-written: {loom / hand:.3f}")


if __name__ == "__main__":
    main()
