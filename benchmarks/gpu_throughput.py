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

Where the difference goes: a third side, the hand-written loop fed by a host DataLoader over
the same task (`Task.fetch`, pinned memory and non-blocking copies on a GPU, as torchloom's
loader) instead of device-resident data, says what reading batches from the host costs; a
fourth, torchloom with torch's intra-op threads on the host set to one, whether the host's
idle threads (spinning between small parallel regions) slow the thread that launches the
kernels; a fifth, torchloom with `training.dataloader.on_device` (the split copied to the
device once, each batch gathered there as the hand-written loop's), whether torchloom's own
loop meets the target once it reads its data as its rival does; and `--profile FILE` writes,
after the rounds, a profile of 20 counted steps of torchloom and of the hand-written loop
(first mode): torch.profiler's operators by host time, Python's functions (cProfile) and, on
a GPU, the operations that synchronised the host with the device
(torch.cuda.set_sync_debug_mode).

    python benchmarks/gpu_throughput.py [--device cuda] [--modes default reduce-overhead]
    python benchmarks/gpu_throughput.py --profile throughput_profile.txt
    python benchmarks/gpu_throughput.py --device cpu --smoke     # the path, in seconds, here

The horizontal flip of the config is left out on both sides (the hand-written loop has no
such step). `--data` is the Fashion-MNIST folder (the task falls back to Debian's
`dataset-fashion-mnist`; on a GPU machine benchmarks/gpu_session.sh passes the carried copy).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import statistics
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from overhead import SEED  # benchmarks/ is on sys.path when a script here runs
from torch.utils.data import DataLoader

from torchloom.api import Hook, RunView, TrainOptions, prepare_training
from torchloom.core.component import Batch
from torchloom.deploy.measure import threads
from torchloom.engine.assemble import assemble
from torchloom.engine.checkpoint import seed_everything
from torchloom.engine.loaders import TaskBatches, to_device

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "fashion_mnist" / "resnet18.yml"


def overrides(
    batch_size: int, steps: int, data: str, compile_mode: str, on_device: bool = False
) -> list[str]:
    """The config as the benchmark trains it: `steps` batches, no evaluation, no flip;
    `on_device`: each batch gathered on the device (`training.dataloader.on_device`)."""
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
        *(["+training.dataloader.on_device=true"] if on_device else []),
    ]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepProfile:
    """Profiles the steps between `start` and `stop`: torch.profiler (host operators and, on a
    GPU, kernels), cProfile (Python functions) and, on a GPU, the host-device synchronisations
    (`torch.cuda.set_sync_debug_mode('warn')` makes each one a warning, recorded here)."""

    def __init__(self, device: torch.device, title: str) -> None:
        self.device, self.title = device, title
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.torch_profile = torch.profiler.profile(activities=activities)
        self.python_profile = cProfile.Profile()
        self.catching = warnings.catch_warnings(record=True)
        self.synchronisations: list[str] = []
        self.steps = 0
        self.seconds = 0.0

    def start(self) -> None:
        synchronize(self.device)
        self.records = self.catching.__enter__()
        warnings.simplefilter("always")
        if self.device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        self.torch_profile.start()
        self.python_profile.enable()
        self.started = time.perf_counter()

    def stop(self, steps: int) -> None:
        synchronize(self.device)
        self.seconds = time.perf_counter() - self.started
        self.python_profile.disable()
        self.torch_profile.stop()
        if self.device.type == "cuda":
            torch.cuda.set_sync_debug_mode("default")
        self.catching.__exit__(None, None, None)
        self.synchronisations = [
            str(r.message) for r in self.records if "synchroniz" in str(r.message)
        ]
        self.steps = steps

    def report(self) -> str:
        """The profile as text: operators by host time, functions by own time, syncs."""
        out = io.StringIO()
        out.write(f"==== {self.title}: {self.steps} steps in {self.seconds * 1e3:.1f} ms ")
        out.write(f"({self.seconds * 1e3 / max(self.steps, 1):.2f} ms a step)\n")
        out.write(f"host-device synchronisations: {len(self.synchronisations)}\n")
        for message in sorted(set(self.synchronisations)):
            count = self.synchronisations.count(message)
            out.write(f"  {count} x {message.splitlines()[0][:160]}\n")
        table = self.torch_profile.key_averages().table(
            sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60
        )
        out.write(f"\n-- torch.profiler, by self host time --\n{table}\n")
        stats = pstats.Stats(self.python_profile, stream=out)
        out.write("-- cProfile, by own time --\n")
        stats.sort_stats("tottime").print_stats(30)
        return out.getvalue()


class StepClock(Hook):
    """Reads the clock after the warm-up's last step and after the last step, each after a
    device synchronisation (the only two a run gets from it); profiles the counted steps
    when given a StepProfile."""

    name = "step_clock"

    def __init__(
        self, device: torch.device, warmup: int, steps: int, profile: StepProfile | None = None
    ) -> None:
        self.device, self.warmup, self.steps = device, warmup, steps
        self.profile = profile
        self.count = 0
        self.started = self.ended = 0.0
        self.epochs: list[int] = []  # completed epochs at both readings
        self.compiled: list[str] = []
        self.dtype: torch.dtype | None = None
        self.batches_per_epoch = 0

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
            self.batches_per_epoch = run.train_data.batches_per_epoch()
            if self.profile is not None:
                if self.count == self.warmup:
                    self.profile.start()
                else:
                    self.profile.stop(self.steps - self.warmup)


def run_torchloom(
    args: argparse.Namespace,
    mode: str,
    profile: StepProfile | None = None,
    on_device: bool = False,
) -> float:
    """Samples per second of `loom train`'s engine after the warm-up steps; `on_device`: with
    `training.dataloader.on_device` (the fifth side)."""
    steps = args.warmup + args.steps
    clock = StepClock(torch.device(args.device), args.warmup, steps, profile)
    with tempfile.TemporaryDirectory() as expdir:
        options = TrainOptions(expdir=expdir, device=args.device, quiet=True, hooks=[clock])
        prepared = prepare_training(
            CONFIG, overrides(args.batch_size, steps, args.data, mode, on_device), options
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


def device_batches(
    images: torch.Tensor, targets: torch.Tensor, batch_size: int, device: torch.device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of device-resident data, each a slice of a shuffled index (reshuffled when
    the next batch would not fit), for ever."""
    generator = torch.Generator(device=device).manual_seed(SEED)
    order = torch.randperm(len(images), device=device, generator=generator)
    position = 0
    while True:
        if position + batch_size > len(order):
            order = torch.randperm(len(images), device=device, generator=generator)
            position = 0
        index = order[position : position + batch_size]
        position += batch_size
        yield images[index], targets[index]


def host_batches(
    task: Any, batch_size: int, device: torch.device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches read on the host as torchloom's loader reads them (the task's `fetch` through
    a DataLoader, pinned on a GPU, copied without blocking), for ever."""
    loader: DataLoader[Any] = DataLoader(
        TaskBatches(task),
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        collate_fn=lambda batch: batch,
        pin_memory=device.type == "cuda",
        generator=torch.Generator().manual_seed(SEED),
    )
    while True:
        for batch in loader:
            batch = to_device(batch, device)
            yield batch["inputs"], batch["targets"]


def run_by_hand(
    args: argparse.Namespace, mode: str, profile: StepProfile | None = None, host: bool = False
) -> float:
    """What a researcher would write for speed: data on the device, autocast, compile;
    `host`: the batches read from the host instead (the third side)."""
    device = torch.device(args.device)
    seed_everything(SEED)
    # The same component classes and parameters as the torchloom side, so the model is too.
    pipeline = assemble(CONFIG, overrides(args.batch_size, 1, args.data, mode)).pipeline
    encoder = pipeline.components["image_encoder"].to(device)
    head = pipeline.components["classifier"].to(device)
    task = pipeline.tasks["training"]
    task.prepare()
    if host:
        batches = host_batches(task, args.batch_size, device)
    else:
        everything = task.fetch(list(range(len(task))))
        images, targets = everything["inputs"].to(device), everything["targets"].to(device)
        batches = device_batches(images, targets, args.batch_size, device)
    options: dict[str, Any] = {} if mode == "default" else {"mode": mode}
    encoder.compile(**options)
    head.compile(**options)
    parameters = [*encoder.parameters(), *head.parameters()]
    optimizer = torch.optim.Adam(parameters, lr=1e-3)  # the config's optimizer
    started = 0.0
    for step in range(args.warmup + args.steps):
        inputs, expected = next(batches)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            features = encoder({"inputs": inputs})["outputs"]
            logits = head({"inputs": features})["predictions"]
            loss = F.cross_entropy(logits, expected)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step + 1 == args.warmup:
            synchronize(device)
            started = time.perf_counter()
            if profile is not None:
                profile.start()
    synchronize(device)
    if profile is not None:
        profile.stop(args.steps)
    return args.steps * args.batch_size / (time.perf_counter() - started)


def run_by_hand_from_host(args: argparse.Namespace, mode: str) -> float:
    return run_by_hand(args, mode, host=True)


def run_torchloom_one_host_thread(args: argparse.Namespace, mode: str) -> float:
    """torchloom with torch's intra-op threads on the host set to one (then restored): the
    host's tensor work (the batch's gather, pinning) in the main thread alone. The H200's
    Sort-of-CLEVR run kept 13 of 16 cores busy (5,525 s of CPU in 417 s): the intra-op
    threads spinning between the small parallel regions of each step, beside the thread that
    launches the kernels."""
    with threads(1):
        return run_torchloom(args, mode)


def run_torchloom_on_device(args: argparse.Namespace, mode: str) -> float:
    """torchloom with `training.dataloader.on_device`: the training split copied to the GPU
    once and each batch gathered there, as the hand-written loop's, instead of built on the
    host, pinned and copied (the same batches as torchloom's own loader)."""
    return run_torchloom(args, mode, on_device=True)


def paired(rates: dict[str, list[float]], top: str, bottom: str) -> tuple[float, float, float]:
    """The median, lowest and highest of the rounds' own ratios top / bottom (in each round
    the two sides ran back to back)."""
    each = [a / b for a, b in zip(rates[top], rates[bottom], strict=True)]
    return statistics.median(each), min(each), max(each)


def shown(pair: tuple[float, float, float]) -> str:
    return f"{pair[0]:.3f} (rounds {pair[1]:.3f}-{pair[2]:.3f})"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--modes", nargs="+", default=["default", "reduce-overhead"])
    parser.add_argument("--batch-size", type=int, default=256)
    # 30 + 180 steps of 256 stay inside the first epoch (55,000 images: 214 batches).
    parser.add_argument("--warmup", type=int, default=30, help="steps left out of the count")
    parser.add_argument("--steps", type=int, default=180, help="steps counted")
    # Odd, so that the median of the rounds' ratios is one round's (two rounds of reduce-overhead
    # on the H200 gave 0.72 and 0.50: a mean of two says little).
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data", default="~/data/fashion-mnist")
    parser.add_argument(
        "--profile", type=Path, help="file for a profile of 20 counted steps of both sides"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes: proves the path, measures nothing"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.batch_size, args.warmup, args.steps, args.rounds = 8, 2, 3, 2  # both orders
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
    # What torchloom's set-up turns on for the whole process (engine/checkpoint.py), set before
    # any side runs, so that the hand-written loop does not depend on running after it.
    if torch.backends.cudnn.is_available():
        torch.backends.cudnn.benchmark = True
    ratios = {}
    sides = {
        "torchloom": run_torchloom,
        "hand-written": run_by_hand,
        "hand-written from the host": run_by_hand_from_host,
        "torchloom, one host thread": run_torchloom_one_host_thread,
        "torchloom, data on the device": run_torchloom_on_device,
    }
    for mode in args.modes:
        rates: dict[str, list[float]] = {name: [] for name in sides}
        for round_ in range(args.rounds):
            names = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            for name in names:
                # Each side compiles as a process of its own would: dynamo keeps its compiled
                # code per forward function, shared by every instance of a model class in
                # the process, so without the reset a side reused the code (and the CUDA
                # graphs' trees) of an earlier side's models, and a side with one host
                # thread added entries beside them (TORCH_LOGS=recompiles showed both).
                torch.compiler.reset()
                gc.collect()  # one side's garbage is not the next one's to collect
                began = time.perf_counter()
                rates[name].append(sides[name](args, mode))
                # Each side as it ends, with its whole time: a round cut short by the
                # session's limit still tells which side was slow (on 2026-11-28 one round of
                # reduce-overhead outlasted 231 s, and no figure of it came back).
                print(
                    f"  compile {mode}, round {round_ + 1}, {name}: "
                    f"{rates[name][-1]:,.0f} samples/s, {time.perf_counter() - began:.0f} s "
                    "with compilation and warm-up",
                    flush=True,
                )
            print(
                f"compile {mode}, round {round_ + 1}: "
                + ", ".join(f"{name} {rates[name][-1]:,.0f} samples/s" for name in sides),
                flush=True,
            )
        loom, hand, host, one_thread, held = (statistics.median(rates[name]) for name in sides)
        # The like-for-like pairs: each loop reading its data the same way.
        on_device = paired(rates, "torchloom, data on the device", "hand-written")
        from_host = paired(rates, "torchloom", "hand-written from the host")
        combined = paired(rates, "torchloom", "hand-written")
        ratios[f"{mode}, data on the device"] = on_device[0]
        ratios[f"{mode}, data from the host"] = from_host[0]
        ratios[mode] = combined[0]
        print(
            f"compile {mode}: medians torchloom {loom:,.0f}, hand-written {hand:,.0f}, "
            f"hand-written from the host {host:,.0f}, torchloom with the data on the device "
            f"{held:,.0f}, torchloom with one host thread {one_thread:,.0f} samples/s. "
            f"Like for like (target >= 0.95): data on the device, torchloom / hand-written "
            f"{shown(on_device)}; data from the host, torchloom / hand-written {shown(from_host)}. "
            f"Combined (torchloom's default loader against device-resident data): "
            f"{shown(combined)}; reading from the host costs the hand-written loop "
            f"{host / hand:.3f} of its speed; one host thread gives torchloom "
            f"{one_thread / loom:.3f} of its speed",
            flush=True,
        )
    if args.profile is not None:
        profiled = argparse.Namespace(**{**vars(args), "steps": min(args.steps, 20)})
        device, mode = torch.device(args.device), args.modes[0]
        reports = []
        for title, runner in (("torchloom", run_torchloom), ("hand-written", run_by_hand)):
            profile = StepProfile(device, f"{title}, compile {mode}")
            torch.compiler.reset()  # as before each side of the rounds
            runner(profiled, mode, profile)
            reports.append(profile.report())
        args.profile.write_text("\n".join(reports))
        print(f"profile of {profiled.steps} steps each: {args.profile}", flush=True)
    return ratios


if __name__ == "__main__":
    main()
