"""Cost of the analysis hooks: a LeNet-5/MNIST epoch with `analysis: {preset: default}`
versus the same run with analysis off, alternating in one process after a warm-up. The
analysis must not change training (the final weights are compared) and must add at most 5%.
The last line prints the time ratio.

    python benchmarks/analysis_cost.py [--epochs 1] [--rounds 2] [--subset N]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import torchloom

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "mnist" / "lenet5.yml"


def run(analysis: bool, epochs: int, subset: int | None, data: str) -> tuple[float, dict]:
    overrides = [
        f"training.terminal_conditions.epoch_limit={epochs}",
        "+training.seed=7",
        f"training.task.data_folder={data}",
        "training.terminal_conditions.early_stopping=null",
    ]
    if subset:
        overrides.append(f"+training.task.subset={subset}")
    if analysis:
        overrides.append("+analysis.preset=default")
    with tempfile.TemporaryDirectory() as expdir:
        start = time.perf_counter()
        result = torchloom.train(CONFIG, overrides, expdir=expdir, analysis=analysis)
        elapsed = time.perf_counter() - start
        reports = (
            sorted(p.name for p in (result.run_dir / "reports").rglob("*"))
            if (result.run_dir / "reports").exists()
            else []
        )
        state = torch.load(result.run_dir / "checkpoints" / "last.pt", weights_only=True)
    if analysis:
        print(f"  analysis wrote {len(reports)} files", flush=True)
    return elapsed, state["components"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--subset", type=int, default=None)
    parser.add_argument("--data", default="~/data/mnist")
    args = parser.parse_args()
    run(True, 1, 512, args.data)  # warm-up: data, lazy imports (matplotlib, tensorboard)
    run(False, 1, 512, args.data)
    on, off = [], []
    for round_ in range(args.rounds):
        order = (True, False) if round_ % 2 == 0 else (False, True)
        for analysis in order:
            elapsed, weights = run(analysis, args.epochs, args.subset, args.data)
            (on if analysis else off).append(elapsed)
            if analysis:
                with_analysis = weights
            else:
                without = weights
        print(
            f"round {round_ + 1}: with analysis {on[-1]:.2f} s, without {off[-1]:.2f} s", flush=True
        )
    identical = all(
        torch.equal(with_analysis[c][k], without[c][k]) for c in without for k in without[c]
    )
    print(f"final weights bit-identical: {identical}")
    print(
        f"median with analysis {statistics.median(on):.2f} s, "
        f"without {statistics.median(off):.2f} s"
    )
    print(
        f"time ratio with / without analysis: {statistics.median(on) / statistics.median(off):.3f}"
    )


if __name__ == "__main__":
    main()
