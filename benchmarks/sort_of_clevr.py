"""Sort-of-CLEVR, the table of Santoro et al. 2017: CNN+RN against CNN+MLP.

Target (issue #4): CNN+RN >= 90% on both the relational and the non-relational questions,
CNN+MLP far lower on the relational ones (the paper: 94% against 63%). Both shipped configs
(configs/vqa/sort_of_clevr_cnn_rn.yml and sort_of_clevr_cnn_mlp.yml) are trained by
`torchloom.train` on the same generated splits, with the overrides below; the script prints,
for each, the validation accuracy per question type after every epoch, then the test accuracy
per question type (with best.pt, the epoch of best validation accuracy), the epochs, the wall
time and the CPU time (user + system of this process, every thread counted).

    python benchmarks/sort_of_clevr.py [--data ~/data/sort_of_clevr] [--epochs 20]
    python benchmarks/sort_of_clevr.py --only rn --threads 1   # one model, one thread
    python benchmarks/sort_of_clevr.py --reduced --threads 1   # the e2e test's variant
    python benchmarks/sort_of_clevr.py --only rn --epochs 40 --rn-override \
        +pipeline.relational_network.pair_distances=true   # g also reads each pair's distance
    python benchmarks/sort_of_clevr.py --only rn --expdir runs/soc   # Ctrl-C keeps last.pt,
    python benchmarks/sort_of_clevr.py --resume runs/soc/RUN         # ... and this goes on
    python benchmarks/sort_of_clevr.py --only rn --epochs 3 --lr 5e-5 \
        --init-from runs/soc/RUN/checkpoints/last.pt   # a new run from a finished one's weights
    python benchmarks/sort_of_clevr.py --only rn --epochs 40 --fit-seconds 700 \
        --try-compile reduce-overhead   # as many epochs as 700 s hold, at most 40

A run stopped by Ctrl-C (or SIGTERM) ends with a checkpoint, and `--resume` continues it
exactly (the same batches, the same weights as without the stop), so a CPU run of many hours
can be done in pieces. `--init-from` starts a new run (fresh Adam state, its own schedule) from
the weights of a finished one: a warm restart, such as a few more epochs at a low rate after a
cosine schedule has reached zero. The script uses the GPU when there is one (torchloom's
default device): the full size needs one (20 epochs of the paper's g take about 15 minutes on an
H100, about 7 hours on a 2-core CPU; docs/benchmarks.md has the figures).

`--fit-seconds S` makes the run one that ends inside S seconds (the probes included), for a
GPU lent for minutes: before it starts, a probe times 200 training steps (after 30 of
warm-up) of the same config eagerly (with torch's host threads and with one) and with each
`--try-compile` mode, takes the way that fits the most epochs, and sets the epoch limit (so
the cosine schedule's length too) to what is left of S at that speed, `--epochs` at most. The
run itself is then an ordinary one, stopped, resumed and reported as any other.

`--reduced` trains the variant of tests/e2e/test_e2e_sort_of_clevr.py (32x32 images, 800 of
them, 7 epochs at 2e-3), which must show the RN ahead on the relational questions.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import resource
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torchloom
from torchloom.errors import LoomError
from torchloom.host_memory import prefer_huge_page_tensors

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "vqa"

# The shipped configs run as they are (the paper's g_theta and f_phi), on the paper's 9,800
# training images, without early stopping.
FULL_COMMON: list[str] = []
FULL_RN: list[str] = []
FULL_MLP: list[str] = []

# The reduced variant that tests/e2e/test_e2e_sort_of_clevr.py trains (it reads these lists):
# 32x32 images with objects of 7 pixels, 800 of them, a CNN of three stride-2 convolutions
# (4x4 maps: 16 objects, 256 pairs), a narrower RN without dropout, 7 epochs at 2e-3;
# otherwise the shipped configs.
REDUCED_COMMON = [
    "training.task.images=800",
    "training.dataloader.batch_size=32",
    "validation.task.images=100",
    "test.task.images=300",
    "training.task.image_size=32",  # validation and test follow the training task
    "training.task.object_size=3",
    "pipeline.image_encoder.layers=["
    + ",".join(["{out_channels: 24, stride: 2, padding: 1, pool: 1}"] * 3)
    + "]",
    "training.terminal_conditions.epoch_limit=7",
    "training.optimizer.lr=2.0e-3",
]
REDUCED_RN = [
    "pipeline.relational_network.g_sizes=[64,64]",
    "pipeline.relational_network.f_sizes=[64,64]",
    "pipeline.relational_network.dropout=0.0",
]
REDUCED_MLP = ["pipeline.flatten.input_dims=[-1,24,4,4]", "pipeline.flatten.output_dims=[-1,384]"]


def init_overrides(checkpoint: str) -> list[str]:
    """`load:` overrides that start every model component of a new run from the weights in
    `checkpoint` (a run's last.pt or best.pt): each component of it whose state has weights."""
    from torchloom.engine.checkpoint import load_checkpoint  # imports torch: not at start-up

    path = Path(checkpoint).expanduser().resolve()
    components = load_checkpoint(path)["components"]
    models = [
        name for name, state in components.items() if any(k.endswith("weight") for k in state)
    ]
    file = json.dumps(str(path))  # a quoted YAML scalar, whatever characters the path has
    return [f"+pipeline.{name}.load={{file: {file}, key: components.{name}}}" for name in models]


@dataclass
class Probe:
    """What a short training run of a config measured: its speed after the warm-up, the
    warm-up (start-up, data, compilation), and the batches of one epoch."""

    way: str  # "eager", or a torch.compile mode
    seconds_per_step: float
    warmup_seconds: float
    batches_per_epoch: int
    threads: int | None = None  # torch's intra-op threads on the host; None: torch's default

    def __str__(self) -> str:
        threads = "" if self.threads is None else f", {self.threads} host thread(s)"
        return f"{self.way}{threads}"


PROBE_WARMUP, PROBE_STEPS = 30, 200
# What --fit-seconds chose and a resumed run needs again, in the folder of the run folders.
FITTED = "fitted.json"


def compiled_in(way: str) -> list[str]:
    """The override that trains the config's models compiled in mode `way` (none: eager)."""
    return [] if way == "eager" else [f"+training.compile={{mode: {way}}}"]


def probe(config: str, overrides: list[str], way: str, threads: int | None = None) -> Probe:
    """Time PROBE_STEPS training steps of `config` with `overrides` after PROBE_WARMUP,
    eagerly or compiled in mode `way`, with `threads` intra-op threads on the host (then
    restored), in a folder thrown away after. A probe stopped by a
    signal (the device call's time limit) raises KeyboardInterrupt: nothing to fit."""
    import torch
    from gpu_throughput import StepClock  # benchmarks/ is on sys.path when this script runs

    from torchloom.api import TrainOptions, prepare_training
    from torchloom.deploy.measure import threads as host_threads

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    steps = PROBE_WARMUP + PROBE_STEPS
    # A compiled way also evaluates 20 images after its steps: evaluation compiles graphs of
    # its own (eval mode), which can fail where training's did not (reduce-overhead's CUDA
    # graphs on the H200, 2026-11-28, before the pipeline marked its steps), and a way that
    # fails there must not be the one the run takes.
    evaluation = ["~validation"] if way == "eager" else ["validation.task.images=20"]
    limits = [
        f"+training.terminal_conditions.episode_limit={steps}",
        "training.terminal_conditions.epoch_limit=1000",
        "training.terminal_conditions.early_stopping=null",
        *evaluation,
        "~test",
    ]
    clock = StepClock(device, PROBE_WARMUP, steps)
    started = time.perf_counter()
    chosen = host_threads(threads) if threads is not None else contextlib.nullcontext()
    with tempfile.TemporaryDirectory() as expdir, chosen:
        options = TrainOptions(expdir=expdir, quiet=True, hooks=[clock])
        run = prepare_training(CONFIGS / config, [*overrides, *compiled_in(way), *limits], options)
        result = run.run()  # type: ignore[union-attr]  # a fresh run: never an old RunResult
    if result.summary["status"] == "interrupted":
        raise KeyboardInterrupt(f"the {way} probe was stopped by a signal")
    if clock.count < steps or clock.epochs[0] != clock.epochs[1]:
        raise RuntimeError(f"the probe ran {clock.count} steps, not {steps} inside one epoch")
    if way != "eager" and not clock.compiled:
        raise RuntimeError("no model was compiled")
    return Probe(
        way,
        (clock.ended - clock.started) / PROBE_STEPS,
        clock.started - started,
        clock.batches_per_epoch,
        threads,
    )


def epochs_that_fit(seconds: float, fastest: Probe, evaluation_share: float, cap: int) -> int:
    """Epochs a run at the probe's speed finishes inside `seconds`: each epoch's batches plus
    its validation (`evaluation_share` of the samples, counted at a training step's cost per
    sample, which a forward pass alone is far under), a tenth more for the saves and the noise;
    besides them the probe's warm-up twice (the run's own start, whose compilation reads the
    probe's from Inductor's cache, and the evaluation passes' compilation in eval mode, a
    forward pass alone) and the test pass."""
    epoch = fastest.batches_per_epoch * fastest.seconds_per_step * (1 + evaluation_share)
    fixed = 2 * fastest.warmup_seconds + 2 * epoch * evaluation_share
    return max(0, min(cap, int((seconds - fixed) / (epoch * 1.1))))


def fit_epochs(
    config: str,
    overrides: list[str],
    seconds: float,
    ways: list[str],
    evaluation_share: float,
    cap: int,
) -> tuple[int, list[str], int | None]:
    """For a run of `config` that ends inside `seconds` of the first probe's start: its epoch
    limit, its compile override and its host threads, of the way that fits the most epochs
    (the faster step when as many fit): eager with torch's threads and with one host thread
    (the H200's eager Sort-of-CLEVR run kept 13 of 16 cores busy, the intra-op threads
    spinning between a step's small parallel regions on the host), then each compile mode
    with the better of those. Prints what it measured."""
    import torch

    started = time.perf_counter()
    probes = [probe(config, overrides, "eager")]
    if torch.get_num_threads() > 1:
        probes.append(probe(config, overrides, "eager", threads=1))
    threads = min(probes, key=lambda p: p.seconds_per_step).threads
    for way in ways:
        try:
            probes.append(probe(config, overrides, way, threads))
        except Exception as error:  # a compile mode this machine cannot run: not taken
            print(f"probe {way}: failed ({type(error).__name__}: {error})", flush=True)
    for p in probes:
        print(
            f"probe {p}: {p.seconds_per_step * 1e3:.2f} ms a step of the {p.batches_per_epoch}"
            f" an epoch has, {p.warmup_seconds:.0f} s to the end of the warm-up",
            flush=True,
        )
    left = seconds - (time.perf_counter() - started)

    def fitted(p: Probe) -> tuple[int, float]:
        return epochs_that_fit(left, p, evaluation_share, cap), -p.seconds_per_step

    best = max(probes, key=fitted)
    epochs = fitted(best)[0]
    print(f"fit: {epochs} epochs ({best}) in the {left:.0f} s the probes left", flush=True)
    if epochs < 1:
        raise SystemExit(f"not one epoch fits in {left:.0f} s")
    limit = f"training.terminal_conditions.epoch_limit={epochs}"
    return epochs, [limit, *compiled_in(best.way)], best.threads


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def train(
    config: str | None, overrides: list[str], expdir: str, resume: str | None = None
) -> dict[str, Any]:
    """Train one pipeline (or continue the run folder `resume`); its summary, validation rows
    by epoch and the CPU and wall time of this call (not of earlier pieces of a resumed run)."""
    cpu, wall = cpu_seconds(), time.perf_counter()
    if resume is not None:
        result = torchloom.train(resume=resume, expdir=expdir, analysis=False)
    else:
        assert config is not None
        result = torchloom.train(CONFIGS / config, overrides, expdir=expdir, analysis=False)
    print(f"run folder: {result.run_dir}", flush=True)
    epochs = []
    with open(result.run_dir / "validation_epoch_statistics.csv", encoding="utf-8") as file:
        for row in csv.DictReader(file):
            epochs.append(row)
    return {
        "summary": result.summary,
        "epochs": epochs,
        "cpu": cpu_seconds() - cpu,
        "wall": time.perf_counter() - wall,
    }


def report(name: str, run: dict[str, Any]) -> None:
    summary = run["summary"]
    print(f"\n{name}: {summary['epochs']} epochs ({summary['status']})", flush=True)
    for row in run["epochs"]:
        print(
            f"  epoch {row['epoch']:>3}: validation non-relational "
            f"{float(row['accuracy_non_relational']):.4f}, relational "
            f"{float(row['accuracy_relational']):.4f}, overall {float(row['accuracy']):.4f}"
        )
    costs = f"wall {run['wall']:.0f} s, CPU {run['cpu']:.0f} s"
    test = summary["final"].get("test")
    if test is None:  # interrupted or diverged: no test pass
        print(f"  no test pass ({summary['reason']}); {costs}", flush=True)
        return
    print(
        f"  test (best.pt, epoch {summary['monitor']['best_epoch']}): non-relational "
        f"{test['accuracy_non_relational']:.4f}, relational {test['accuracy_relational']:.4f}, "
        f"overall {test['accuracy']:.4f}; {costs}",
        flush=True,
    )
    prefix = "subtype_accuracy_"
    subtypes = {k.removeprefix(prefix): v for k, v in test.items() if k.startswith(prefix)}
    if subtypes:
        print("  test per subtype: " + ", ".join(f"{k} {v:.4f}" for k, v in subtypes.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="~/data/sort_of_clevr", help="cache of the splits")
    parser.add_argument(
        "--epochs", type=int, help="epoch limit of each model (default: 20, reduced: 7)"
    )
    parser.add_argument("--images", type=int, default=9800, help="training images")
    parser.add_argument("--eval-images", type=int, default=500, help="validation/test images")
    parser.add_argument(
        "--lr", type=float, help="Adam learning rate (default: the config's; reduced: 2e-3)"
    )
    parser.add_argument("--only", choices=("rn", "mlp"), help="train one of the two")
    parser.add_argument("--reduced", action="store_true", help="the e2e test's variant")
    parser.add_argument("--expdir", help="keep the run folders here (default: a temp dir)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    for model in ("both", "rn", "mlp"):
        parser.add_argument(
            f"--{model}-override",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help=f"one more config override for {'both models' if model == 'both' else model}",
        )
    parser.add_argument(
        "--fit-seconds",
        type=float,
        help="with --only: as many epochs as this many seconds of training hold (--epochs at "
        "most), measured by a probe before the run starts",
    )
    parser.add_argument(
        "--try-compile",
        action="append",
        default=[],
        metavar="MODE",
        help="with --fit-seconds: also probe this torch.compile mode, and train with it if it "
        "fits the most epochs",
    )
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue this stopped run")
    parser.add_argument(
        "--init-from",
        metavar="CHECKPOINT",
        help="with --only: a new run whose models start from this checkpoint's weights (fresh "
        "optimizer and schedule), e.g. to go on from a finished run at a new learning rate",
    )
    args = parser.parse_args()
    if args.init_from and not args.only:
        parser.error("--init-from needs --only rn or --only mlp: a checkpoint holds one model")
    if args.fit_seconds and (not args.only or args.resume):
        parser.error("--fit-seconds needs --only rn or --only mlp, and a new run")
    if args.try_compile and not args.fit_seconds:
        parser.error("--try-compile is for --fit-seconds")
    prefer_huge_page_tensors()  # as the loom command does; before torch is imported
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.resume:
        # A fitted run goes on with the host threads its probes chose (not in its config).
        fitted = Path(args.resume).expanduser().resolve().parents[1] / FITTED
        if fitted.is_file() and not args.threads:
            threads = json.loads(fitted.read_text(encoding="utf-8"))["threads"]
            if threads is not None:
                torch.set_num_threads(threads)
                print(f"host threads: {threads}, as the probes chose ({fitted})", flush=True)
        run = train(None, [], str(Path(args.resume).expanduser().parent), resume=args.resume)
        report(f"resumed {args.resume} (costs of this piece only)", run)
        return
    epochs = args.epochs or (7 if args.reduced else 20)
    lr = args.lr
    if args.reduced:
        common, rn, mlp = REDUCED_COMMON, REDUCED_RN, REDUCED_MLP
        common = [
            *common,
            *([f"training.terminal_conditions.epoch_limit={args.epochs}"] if args.epochs else []),
            *([f"training.optimizer.lr={lr}"] if lr else []),
        ]
    else:
        common, rn, mlp = FULL_COMMON, FULL_RN, FULL_MLP
        common = [
            *common,
            f"training.task.images={args.images}",
            f"validation.task.images={args.eval_images}",
            f"test.task.images={args.eval_images}",
            f"training.terminal_conditions.epoch_limit={epochs}",
            *([f"training.optimizer.lr={lr}"] if lr else []),
        ]
    common = [
        *common,
        f"training.task.data_folder={args.data}",
        "+training.seed=0",
        # No early stop (best.pt is still the epoch of best validation accuracy).
        "training.terminal_conditions.early_stopping.patience=1000",
    ]
    if args.init_from:
        try:
            loads = init_overrides(args.init_from)
        except LoomError as error:  # a missing or foreign file: its message, exit status 2
            parser.error(error.format())
        args.rn_override, args.mlp_override = (
            [*args.rn_override, *loads],
            [*args.mlp_override, *loads],
        )
    print(f"common overrides: {common}", flush=True)
    with tempfile.TemporaryDirectory() as temporary:
        expdir = args.expdir or temporary
        runs = {}
        models = [
            ("rn", "CNN+RN", "sort_of_clevr_cnn_rn.yml", rn, args.rn_override),
            ("mlp", "CNN+MLP", "sort_of_clevr_cnn_mlp.yml", mlp, args.mlp_override),
        ]
        for key, name, config, model, own in models:
            if args.only not in (None, key):
                continue
            overrides = [*common, *model, *args.both_override, *own]
            if args.fit_seconds:
                evaluation_share = 100 / 800 if args.reduced else args.eval_images / args.images
                _, fitted, threads = fit_epochs(
                    config, overrides, args.fit_seconds, args.try_compile, evaluation_share, epochs
                )
                overrides += fitted
                if threads is not None:
                    torch.set_num_threads(threads)
                Path(expdir).mkdir(parents=True, exist_ok=True)
                (Path(expdir) / FITTED).write_text(json.dumps({"threads": threads}) + "\n")
            runs[name] = train(config, overrides, expdir)
            report(name, runs[name])
    if len(runs) == 2 and all("test" in run["summary"]["final"] for run in runs.values()):
        rn_test = runs["CNN+RN"]["summary"]["final"]["test"]
        mlp_test = runs["CNN+MLP"]["summary"]["final"]["test"]
        print(
            f"\nrelational test accuracy: CNN+RN {rn_test['accuracy_relational']:.4f} vs "
            f"CNN+MLP {mlp_test['accuracy_relational']:.4f} (paper: 0.94 vs 0.63); "
            f"non-relational: {rn_test['accuracy_non_relational']:.4f} vs "
            f"{mlp_test['accuracy_non_relational']:.4f}; target: CNN+RN >= 0.90 on both"
        )


if __name__ == "__main__":
    main()
