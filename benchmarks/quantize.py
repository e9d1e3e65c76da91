"""Float against int8, and torch against ONNX Runtime, side by side in one run: `loom quantize`
and `loom export --format onnx --int8` on trained runs. One thread, medians of repeated runs,
warm-up excluded; float and int8 (or torch and ONNX Runtime) timed in turns within each
repeat, so a load that changes during the benchmark slows both alike.

Groups (`--only`, default all):
    lenet5    LeNet-5 / MNIST: static and QAT int8, ONNX float and int8
    ffn       784-256-128-10 feed-forward network / MNIST: dynamic int8
    resnet18  ResNet-18 / Fashion-MNIST 32x32 (configs/fashion_mnist/resnet18.yml, trained on
              --resnet-subset images for --resnet-epochs): static and QAT int8, ONNX float
              and int8
    bbc       BBC News bag of words (bbc_news_bow_ffn.yml) and GRU (bbc_news_embeddings_gru.yml),
              each trained --bbc-epochs epochs: dynamic int8

Targets (issue #16): ResNet-18 static >= 2x at batch 32 and >= 1.5x at batch 1, size <= 0.27x,
test accuracy drop <= 0.5 points; LeNet-5 static >= 1.8x at batch 32, size <= 0.35x, drop
<= 0.5 points; QAT recovers at least half of any post-training drop above 0.2 points; BBC
bag of words dynamic >= 1.5x at batch 32, drop <= 0.5 points (GRU: reported); ONNX Runtime
float at least as fast as torch eager at batch 1 and 32, max abs difference <= 1e-4.

    python benchmarks/quantize.py [--only lenet5,resnet18] [--expdir DIR] [--repeats 50]
        [--mnist ~/data/mnist] [--epochs 2] [--resnet-subset 12000] [--resnet-epochs 2]
        [--bbc-epochs 5] [--qat-epochs 1]

Runs already trained in --expdir (a finished run of the same pipeline) are reused.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import torchloom
from torchloom.deploy.export import export
from torchloom.deploy.measure import machine
from torchloom.deploy.quantize import quantize

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
GROUPS = ("lenet5", "ffn", "resnet18", "bbc")


def train(config: str, overrides: list[str], expdir: str) -> Path:
    result = torchloom.train(
        CONFIGS / config,
        ["+training.seed=0", *overrides],
        expdir=expdir,
        analysis=False,
        tensorboard=0,
    )
    return Path(result.run_dir)


def reused(expdir: str, name: str) -> Path | None:
    """The latest finished run of `name` already in `expdir` (a second benchmark run on the
    same --expdir measures again without training again), or None."""
    runs = sorted(p.parent.parent for p in Path(expdir).glob(f"{name}/*/checkpoints/best.pt"))
    return runs[-1] if runs and (runs[-1] / "test_statistics.csv").is_file() else None


def trained(expdir: str, name: str, config: str, overrides: list[str]) -> Path:
    started = time.perf_counter()
    run = reused(expdir, name)
    if run is None:
        run = train(config, overrides, expdir)
        print(f"{name}: trained in {time.perf_counter() - started:.0f} s: {run}")
    else:
        print(f"{name}: reused {run}")
    return run


def accuracy(report: dict[str, Any], side: str) -> float:
    return float(report["statistics"]["test"][side]["accuracy"])


def quantized_line(name: str, report: dict[str, Any]) -> str:
    drop = 100 * (accuracy(report, "float") - accuracy(report, "int8"))
    latency = report["latency_ms"]
    return (
        f"{name} {report['mode']}: float/int8 time batch 1 {latency['1']['speedup']:.2f}x "
        f"({latency['1']['float']:.3f} -> {latency['1']['int8']:.3f} ms), batch 32 "
        f"{latency['32']['speedup']:.2f}x ({latency['32']['float']:.3f} -> "
        f"{latency['32']['int8']:.3f} ms); size {report['size_ratio']:.3f}x "
        f"({report['size_bytes']['float']:,} -> {report['size_bytes']['int8']:,} bytes); "
        f"test accuracy {accuracy(report, 'float'):.4f} -> {accuracy(report, 'int8'):.4f} "
        f"(drop {drop:.2f} points)"
    )


def qat_line(name: str, static: dict[str, Any], qat: dict[str, Any]) -> str:
    """How much of the post-training drop quantization-aware training recovers."""
    base = accuracy(static, "float")
    static_drop = 100 * (base - accuracy(static, "int8"))
    qat_drop = 100 * (base - accuracy(qat, "int8"))
    recovered = (
        f"recovers {(static_drop - qat_drop) / static_drop:.0%} of it"
        if static_drop > 0.2
        else "(post-training drop <= 0.2 points: nothing to recover)"
    )
    return (
        f"{name} QAT ({qat['qat']['epochs']} epoch(s)): test accuracy float {base:.4f}, "
        f"static int8 drop {static_drop:.2f} points, QAT int8 drop {qat_drop:.2f} points "
        f"{recovered}"
    )


def onnx_lines(name: str, run: Path, repeats: int, inputs: list[str] | None = None) -> None:
    report = export(run, "onnx", repeats=repeats, force=True, int8=True, inputs=inputs or ()).report
    for batch, entry in report["latency_ms"].items():
        print(
            f"{name} ONNX Runtime float, batch {batch}: torch/ORT time "
            f"{entry['speedup']:.2f}x ({entry['torch_eager']:.3f} -> "
            f"{entry['onnxruntime']:.3f} ms)"
        )
    print(f"{name} ONNX max abs difference: {report['check']['max_abs_difference']:.3g}")
    int8 = report["int8"]
    for batch, entry in int8["latency_ms"].items():
        print(
            f"{name} ONNX Runtime int8 (QDQ), batch {batch}: float/int8 time "
            f"{entry['speedup']:.2f}x ({entry['float']:.3f} -> {entry['int8']:.3f} ms)"
        )
    print(
        f"{name} ONNX int8: size {int8['bytes'] / int8['float_bytes']:.3f}x, top-1 "
        f"agreement with float {int8['top1_agreement_with_float']:.4f}"
    )


def load() -> str:
    with open("/proc/loadavg", encoding="utf-8") as handle:
        return handle.read().split()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(GROUPS))
    parser.add_argument("--mnist", default="~/data/mnist")
    parser.add_argument("--epochs", type=int, default=2, help="LeNet-5 and FFN epochs")
    parser.add_argument("--resnet-subset", type=int, default=12000)
    parser.add_argument("--resnet-epochs", type=int, default=2)
    parser.add_argument("--bbc-epochs", type=int, default=5)
    parser.add_argument("--qat-epochs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--expdir", default=None)
    args = parser.parse_args()
    groups = [g.strip() for g in args.only.split(",") if g.strip()]
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        parser.error(f"unknown groups {unknown}; groups: {', '.join(GROUPS)}")
    # Training and evaluation on one thread too: on a shared 2-core machine, two OpenMP
    # threads wait on each other (a ResNet-18 step took 8 s instead of 1.2 s).
    torch.set_num_threads(1)
    print(
        f"machine: {machine()}, {os.cpu_count()} CPUs, 1 thread, {args.repeats} timed runs "
        f"per figure; load average at the start: {load()}"
    )
    mnist = [f"training.task.data_folder={args.mnist}"]
    with tempfile.TemporaryDirectory() as temporary:
        expdir = args.expdir or temporary
        if "lenet5" in groups:
            overrides = [f"training.terminal_conditions.epoch_limit={args.epochs}", *mnist]
            lenet = trained(expdir, "lenet5", "mnist/lenet5.yml", overrides)
            static = quantize(lenet, "static", repeats=args.repeats, force=True).report
            print(quantized_line("LeNet-5", static))
            qat = quantize(
                lenet, "qat", repeats=args.repeats, force=True, qat_epochs=args.qat_epochs
            ).report
            print(quantized_line("LeNet-5", qat))
            print(qat_line("LeNet-5", static, qat))
            onnx_lines("LeNet-5", lenet, args.repeats)
        if "ffn" in groups:
            overrides = [f"training.terminal_conditions.epoch_limit={args.epochs}", *mnist]
            ffn = trained(expdir, "ffn", "mnist/ffn.yml", overrides)
            dynamic = quantize(ffn, "dynamic", repeats=args.repeats, force=True).report
            print(quantized_line("FFN 784-256-128-10", dynamic))
        if "resnet18" in groups:
            overrides = [
                f"training.terminal_conditions.epoch_limit={args.resnet_epochs}",
                f"+training.task.subset={args.resnet_subset}",
            ]
            resnet = trained(expdir, "resnet18", "fashion_mnist/resnet18.yml", overrides)
            static = quantize(resnet, "static", repeats=args.repeats, force=True).report
            print(quantized_line("ResNet-18", static))
            qat = quantize(
                resnet, "qat", repeats=args.repeats, force=True, qat_epochs=args.qat_epochs
            ).report
            print(quantized_line("ResNet-18", qat))
            print(qat_line("ResNet-18", static, qat))
            onnx_lines("ResNet-18", resnet, args.repeats)
        if "bbc" in groups:
            overrides = [f"training.terminal_conditions.epoch_limit={args.bbc_epochs}"]
            bow = trained(expdir, "bbc_news_bow_ffn", "language/bbc_news_bow_ffn.yml", overrides)
            report = quantize(bow, "dynamic", repeats=args.repeats, force=True).report
            print(quantized_line("BBC News bag of words", report))
            gru = trained(
                expdir, "bbc_news_embeddings_gru", "language/bbc_news_embeddings_gru.yml", overrides
            )
            report = quantize(gru, "dynamic", repeats=args.repeats, force=True).report
            print(quantized_line("BBC News GRU", report))
            left = [f"{x['name']} ({x['reason']})" for x in report["layers"] if not x["quantized"]]
            print(f"BBC News GRU left in float: {', '.join(left) or 'nothing'}")
        print(f"load average at the end: {load()}")


if __name__ == "__main__":
    main()
