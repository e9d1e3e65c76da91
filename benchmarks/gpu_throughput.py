"""Training throughput of a ResNet-18 on 32x32 Fashion-MNIST through `torchloom.train`
versus a hand-written AMP + torch.compile loop, in this one process (issue 18, item 4).

Both sides train the same pipeline components (configs/fashion_mnist/resnet18.yml: the
torchvision ResNet-18 encoder and the feed-forward head), at the same batch size, with the
same Adam, bf16 autocast and torch.compile (the compile mode given). torchloom runs as a user
runs it: `training.precision: bf16`, `training.compile`, its own loader (pinned memory and
non-blocking copies on a GPU). The hand-written loop is the strictest rival: the training
images already on the device, a batch a slice of a shuffled index. Samples per second count
only the steps after the warm-up (compilation, CUDA-graph capture, cuDNN tuning), between two
device synchronisations; validation and test are left out of both. The sides alternate
rounds (torchloom first in odd rounds) so machine noise hits both alike; each line prints
both figures and the ratio torchloom / hand-written (target >= 0.95 on a GPU).

    python benchmarks/gpu_throughput.py [--device cuda] [--modes default reduce-overhead]
    python benchmarks/gpu_throughput.py --device cpu --smoke     # the path, in seconds, here

The horizontal flip of the config is left out on both sides (the hand-written loop has no
such step). `--data` is the Fashion-MNIST folder (the task falls back to Debian's
`dataset-fashion-mnist`; on a GPU machine benchmarks/gpu_session.sh passes the carried copy).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from overhead import SEED  # benchmarks/ is on sys.path when a script here runs

from torchloom.api import Hook, RunView, TrainOptions, prepare_training
from torchloom.core.component import Batch
from torchloom.engine.assemble import assemble
from torchloom.engine.checkpoint import seed_everything

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "fashion_mnist" / "resnet18.yml"


def overrides(batch_size: int, steps: int, data: str, compile_mode: str) -> list[str]:
    """The config as the benchmark trains it: `steps` batches, no evaluation, no flip."""
    compiled = "true" if compile_mode == "default" else f"{{mode: {compile_mode}}}"
    return [
        f"+training.seed={SEED}",
        f"training.task.data_folder={data}",
        "~training.task.transforms",
        f"training.dataloader.batch_size={batch_size}",
        "training.dataloader.drop_last=true",  # every step the same shape: no recompilation
        f"+training.terminal_conditions.episode_limit={steps}",
        "training.terminal_conditions.epoch_limit=1000",
        "training.terminal_conditions.early_stopping=null",
        "~validation",
        "~test",
        "+training.precision=bf16",
        f"+training.compile={compiled}",
    ]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepClock(Hook):
    """Reads the clock after the warm-up's last step and after the last step, each after a
    device synchronisation (the only two a run gets from it)."""

    name = "step_clock"

    def __init__(self, device: torch.device, warmup: int, steps: int) -> None:
        self.device, self.warmup, self.steps = device, warmup, steps
        self.count = 0
        self.started = self.ended = 0.0
        self.epochs: list[int] = []  # completed epochs at both readings
        self.compiled: list[str] = []
        self.dtype: torch.dtype | None = None

    def after_step(self, run: RunView, batch: Batch, loss: torch.Tensor) -> None:
        self.count += 1
        if self.count in (self.warmup, self.steps):
            synchronize(self.device)
            now = time.perf_counter()
            if self.count == self.warmup:
                self.started = now
            else:
                self.ended = now
            self.epochs.append(run.progress.epoch)
            self.compiled, self.dtype = run.compiled_models, run.precision.dtype


def run_torchloom(args: argparse.Namespace, mode: str) -> float:
    """Samples per second of `loom train`'s engine after the warm-up steps."""
    steps = args.warmup + args.steps
    clock = StepClock(torch.device(args.device), args.warmup, steps)
    with tempfile.TemporaryDirectory() as expdir:
        options = TrainOptions(expdir=expdir, device=args.device, quiet=True, hooks=[clock])
        prepared = prepare_training(
            CONFIG, overrides(args.batch_size, steps, args.data, mode), options
        )
        prepared.run()  # type: ignore[union-attr]  # a fresh run: never an old RunResult
    if clock.count < steps:
        raise RuntimeError(f"torchloom stopped after {clock.count} of {steps} steps")
    # What the figure claims, checked: both models compiled, bf16, and no epoch's end (a
    # checkpoint save, a new loader) inside the counted steps, as the hand-written loop has none.
    if sorted(clock.compiled) != ["classifier", "image_encoder"] or clock.dtype != torch.bfloat16:
        raise RuntimeError(f"torchloom compiled {clock.compiled}, autocast to {clock.dtype}")
    if clock.epochs[0] != clock.epochs[1]:
        raise RuntimeError("the counted steps crossed an epoch's end: lower --warmup/--steps")
    return args.steps * args.batch_size / (clock.ended - clock.started)


def run_by_hand(args: argparse.Namespace, mode: str) -> float:
    """What a researcher would write for speed: data on the device, autocast, compile."""
    device = torch.device(args.device)
    seed_everything(SEED)
    # The same component classes and parameters as the torchloom side, so the model is too.
    pipeline = assemble(CONFIG, overrides(args.batch_size, 1, args.data, mode)).pipeline
    encoder = pipeline.components["image_encoder"].to(device)
    head = pipeline.components["classifier"].to(device)
    task = pipeline.tasks["training"]
    task.prepare()
    everything = task.fetch(list(range(len(task))))
    images = everything["inputs"].to(device)
    targets = everything["targets"].to(device)
    options: dict[str, Any] = {} if mode == "default" else {"mode": mode}
    encoder.compile(**options)
    head.compile(**options)
    parameters = [*encoder.parameters(), *head.parameters()]
    optimizer = torch.optim.Adam(parameters, lr=1e-3)  # the config's optimizer
    generator = torch.Generator(device=device).manual_seed(SEED)
    order = torch.randperm(len(images), device=device, generator=generator)
    position = 0
    started = 0.0
    for step in range(args.warmup + args.steps):
        if position + args.batch_size > len(order):
            order = torch.randperm(len(images), device=device, generator=generator)
            position = 0
        index = order[position : position + args.batch_size]
        position += args.batch_size
        with torch.autocast(device.type, dtype=torch.bfloat16):
            features = encoder({"inputs": images[index]})["outputs"]
            logits = head({"inputs": features})["predictions"]
            loss = F.cross_entropy(logits, targets[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step + 1 == args.warmup:
            synchronize(device)
            started = time.perf_counter()
    synchronize(device)
    return args.steps * args.batch_size / (time.perf_counter() - started)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--modes", nargs="+", default=["default", "reduce-overhead"])
    parser.add_argument("--batch-size", type=int, default=256)
    # 30 + 180 steps of 256 stay inside the first epoch (55,000 images: 214 batches).
    parser.add_argument("--warmup", type=int, default=30, help="steps left out of the count")
    parser.add_argument("--steps", type=int, default=180, help="steps counted")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--data", default="~/data/fashion-mnist")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes: proves the path, measures nothing"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.batch_size, args.warmup, args.steps, args.rounds = 8, 2, 3, 1
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be at least 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse(argv)
    if args.device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(args.device))
    else:
        name = f"cpu, {torch.get_num_threads()} threads"
    print(f"device: {name}; torch {torch.__version__}", flush=True)
    print(
        f"batch {args.batch_size}, {args.warmup} warm-up steps, {args.steps} counted, "
        f"{args.rounds} rounds, bf16 autocast, torch.compile",
        flush=True,
    )
    ratios = {}
    for mode in args.modes:
        loom_rates, hand_rates = [], []
        for round_ in range(args.rounds):
            order = (
                (run_torchloom, run_by_hand) if round_ % 2 == 0 else (run_by_hand, run_torchloom)
            )
            for runner in order:
                rate = runner(args, mode)
                (loom_rates if runner is run_torchloom else hand_rates).append(rate)
            print(
                f"compile {mode}, round {round_ + 1}: torchloom {loom_rates[-1]:,.0f} "
                f"samples/s, hand-written {hand_rates[-1]:,.0f} samples/s",
                flush=True,
            )
        loom, hand = statistics.median(loom_rates), statistics.median(hand_rates)
        ratios[mode] = loom / hand
        print(
            f"compile {mode}: median torchloom {loom:,.0f} samples/s, hand-written "
            f"{hand:,.0f} samples/s, ratio torchloom / hand-written {loom / hand:.3f} "
            "(target >= 0.95)",
            flush=True,
        )
    return ratios


if __name__ == "__main__":
    main()
