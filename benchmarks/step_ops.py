"""Tensor operations a training step of `torchloom.train` dispatches, by part of the step.

On a GPU a small model's step is bound by the host (docs/benchmarks.md, "On a lent GPU:
figures"): each tensor operation costs a kernel launch and the dispatcher's work on the host,
microseconds that add up over hundreds of calls a step, whatever the arithmetic. Counting
the operations needs no GPU and gives the same figure on every run, so this script counts
them here: every ATen operation (a TorchDispatchMode) over `--steps` steps after a warm-up,
inside the first epoch, split by the part of the step that called it:

- model forward (the pipeline's components, the losses included), backward and optimizer:
  what a hand-written loop does too;
- the batch (the task's fetch and the copy to the device), the statistics and loss meters,
  the divergence guard and what follows the step: torchloom's own.

The optimizer runs as torch runs it on a GPU (`foreach=True`, one call for all parameters;
on the CPU torch's default is a loop over them). Statistics rows, validation and checkpoints
happen every so many steps, not in every step: the counted steps hold none of them
(`logging_interval` is set past them).

    python benchmarks/step_ops.py                       # the Sort-of-CLEVR RN config
    python benchmarks/step_ops.py --config configs/fashion_mnist/resnet18.yml \
        --override training.task.data_folder=/tmp/fm --override "~training.task.transforms"
"""

from __future__ import annotations

import argparse
import collections
import functools
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torchloom.api import Hook, RunView, TrainOptions, prepare_training
from torchloom.core.component import Batch
from torchloom.core.pipeline import Pipeline
from torchloom.engine import loaders, step, trainer

ROOT = Path(__file__).resolve().parents[1]
SORT_OF_CLEVR = ROOT / "configs" / "vqa" / "sort_of_clevr_cnn_rn.yml"
# The parts a hand-written loop has as well; the others are torchloom's own.
MODEL_PARTS = ("model forward", "backward", "optimizer")


class OperationCount(TorchDispatchMode):
    """Counts every ATen operation under the part of the step named last in `parts`."""

    def __init__(self) -> None:
        super().__init__()
        self.parts = ["backward"]  # what no wrapped method calls: autograd's backward pass
        self.counts: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.counts[self.parts[-1]][func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


COUNT = OperationCount()


def in_part(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def counted(*args: Any, **kwargs: Any) -> Any:
        COUNT.parts.append(name)
        try:
            return method(*args, **kwargs)
        finally:
            COUNT.parts.pop()

    return counted


def label_the_parts() -> None:
    """Wrap the methods the loop calls for each part (this process only)."""
    parts: list[tuple[Any, str, str]] = [
        (loaders.TaskBatches, "__getitems__", "batch"),
        (trainer, "to_device", "batch"),
        (Pipeline, "__call__", "model forward"),
        (step.WeightedLoss, "__call__", "model forward"),
        (step.DivergenceGuard, "check", "divergence guard"),
        (trainer.TrainingLoop, "optimizer_step", "optimizer"),
        (trainer.TrainingLoop, "record_step", "statistics and meters"),
        (trainer.TrainingLoop, "after_step", "after the step"),
    ]
    for owner, name, part in parts:
        setattr(owner, name, in_part(part, getattr(owner, name)))


class CountSteps(Hook):
    """Counts from the end of step `warmup` to the end of step `warmup + steps`."""

    name = "count_steps"

    def __init__(self, warmup: int, steps: int) -> None:
        self.warmup, self.steps, self.done = warmup, steps, 0
        self.epochs: list[int] = []

    def after_step(self, run: RunView, batch: Batch, loss: torch.Tensor) -> None:
        self.done += 1
        if self.done == self.warmup:
            self.epochs.append(run.progress.epoch)
            COUNT.__enter__()
        elif self.done == self.warmup + self.steps:
            COUNT.__exit__(None, None, None)
            self.epochs.append(run.progress.epoch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(SORT_OF_CLEVR))
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--top", type=int, default=8, help="operations shown per part")
    args = parser.parse_args()
    torch.manual_seed(0)
    steps = args.warmup + args.steps
    overrides = [
        "+training.optimizer.foreach=true",  # torch's default on a GPU
        f"+training.terminal_conditions.episode_limit={steps}",
        "training.terminal_conditions.epoch_limit=1000",
        f"+training.logging_interval={steps + 1}",  # no statistics row inside the count
        "training.terminal_conditions.early_stopping=null",
        "~validation",
        "~test",
        *args.override,
    ]
    label_the_parts()
    hook = CountSteps(args.warmup, args.steps)
    with tempfile.TemporaryDirectory() as expdir:
        if args.config == str(SORT_OF_CLEVR):  # a small split, generated in a moment
            data = ["training.task.images=100", f"training.task.data_folder={expdir}/data"]
            overrides = data + overrides
        options = TrainOptions(expdir=expdir, device="cpu", quiet=True, hooks=[hook])
        prepare_training(args.config, tuple(overrides), options).run()  # type: ignore[union-attr]
    if len(hook.epochs) != 2 or hook.epochs[0] != hook.epochs[1]:
        raise SystemExit("the counted steps must lie inside one epoch: fewer --steps")
    per_step = {part: sum(c.values()) / args.steps for part, c in COUNT.counts.items()}
    total = sum(per_step.values())
    model = sum(per_step.get(part, 0.0) for part in MODEL_PARTS)
    print(f"{args.config} {' '.join(args.override)}")
    print(
        f"tensor operations a step: {total:.1f} (model, backward, optimizer: {model:.1f}; "
        f"torchloom's own: {total - model:.1f}, {(total - model) / model:.1%} of the model's)"
    )
    for part in sorted(per_step, key=lambda p: (p not in MODEL_PARTS, -per_step[p])):
        top = COUNT.counts[part].most_common(args.top)
        shown = ", ".join(f"{name} {count / args.steps:g}" for name, count in top)
        print(f"  {part}: {per_step[part]:.1f}  ({shown})")


if __name__ == "__main__":
    main()
