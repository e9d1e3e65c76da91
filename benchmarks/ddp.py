"""Several processes on this machine (DDP over gloo on the CPU) against one: LeNet-5 on an
MNIST subset, one epoch, at two batch sizes, the same global batch for both. Runs alternate
(one process, two processes) for `--rounds`; medians of the training wall time per epoch
are printed with their ratio. There is no target on two shared cores: the figure is there
for honesty (a CPU run gains nothing from a second process that shares its cores).
`--preset default` runs the default analysis (the `minimal` preset otherwise) and prints
what it cost each run's training, as run.log says it (under two processes the per-sample
reports run in both and merge their shares at each pass's end).

    python benchmarks/ddp.py [--subset 20000] [--rounds 2] [--batches 64 512] [--preset P]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "mnist" / "lenet5.yml"


def epoch_seconds(nproc: int, batch: int, subset: int, preset: str, expdir: Path) -> float:
    command = [
        sys.executable, "-m", "torchloom.cli.main", "train", str(CONFIG),
        f"+training.task.subset={subset}", "+validation.task.subset=1000",
        "+test.task.subset=1000", "training.terminal_conditions.epoch_limit=1",
        f"training.dataloader.batch_size={batch}",
        "training.terminal_conditions.early_stopping=null",
        f"+analysis.preset={preset}", "--expdir", str(expdir), "--quiet", "--tensorboard", "0",
        "--nproc", str(nproc),
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True)
    (summary,) = expdir.glob("*/*/summary.json")
    if preset != "minimal":
        log = (summary.parent / "run.log").read_text().splitlines()
        cost = next(line for line in log if "analysis took" in line)
        print(f"  {nproc} process(es), batch {batch}: {cost.split('INFO ', 1)[-1]}")
    return float(json.loads(summary.read_text())["wall_time_seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subset", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--preset", default="minimal", choices=["minimal", "default", "full"])
    args = parser.parse_args()
    for batch in args.batches:
        times: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(args.rounds):
            for nproc in (1, 2):
                with tempfile.TemporaryDirectory() as folder:
                    seconds = epoch_seconds(nproc, batch, args.subset, args.preset, Path(folder))
                    times[nproc].append(seconds)
        one, two = statistics.median(times[1]), statistics.median(times[2])
        print(
            f"batch {batch}, {args.subset} images: 1 process {one:.1f} s/epoch, 2 processes "
            f"{two:.1f} s/epoch, ratio {two / one:.2f} (rounds {args.rounds}, analysis "
            f"{args.preset})"
        )


if __name__ == "__main__":
    main()
