"""Float against int8, and torch against ONNX Runtime, side by side in one run: `loom quantize`
(static on LeNet-5, dynamic on a feed-forward network, both on MNIST) and `loom export
--format onnx` on the LeNet-5 run. One thread, medians of repeated runs, warm-up excluded.

Targets (issue #16): LeNet-5 static >= 1.8x faster at batch 32 (batch 1 reported), size
<= 0.35x, test accuracy drop <= 0.5 points; ONNX Runtime float at least as fast as eager at
batch 1 and 32, max abs difference <= 1e-4.

    python benchmarks/quantize.py [--data ~/data/mnist] [--epochs 2] [--repeats 50]
                                  [--expdir DIR (keep the runs; default: a temporary one)]

Float and int8 (or torch and ONNX Runtime) are timed in turns within each repeat, so a load
that changes during the benchmark slows both alike.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torchloom
from torchloom.deploy.export import export
from torchloom.deploy.measure import machine
from torchloom.deploy.quantize import quantize

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "mnist"


def train(config: str, epochs: int, data: str, expdir: str) -> Path:
    result = torchloom.train(
        CONFIGS / config,
        [
            f"training.terminal_conditions.epoch_limit={epochs}",
            "+training.seed=0",
            f"training.task.data_folder={data}",
        ],
        expdir=expdir,
        analysis=False,
        tensorboard=0,
    )
    return Path(result.run_dir)


def reused(expdir: str, name: str) -> Path | None:
    """The latest finished run of `name` already in `expdir` (a second benchmark run on the
    same --expdir measures again without training again), or None."""
    runs = sorted(p.parent.parent for p in Path(expdir).glob(f"{name}/*/checkpoints/best.pt"))
    return runs[-1] if runs else None


def quantized_line(name: str, report: dict) -> str:
    test = report["statistics"]["test"]
    drop = 100 * (test["float"]["accuracy"] - test["int8"]["accuracy"])
    latency = report["latency_ms"]
    return (
        f"{name} {report['mode']}: float/int8 time batch 1 {latency['1']['speedup']:.2f}x "
        f"({latency['1']['float']:.3f} -> {latency['1']['int8']:.3f} ms), batch 32 "
        f"{latency['32']['speedup']:.2f}x ({latency['32']['float']:.3f} -> "
        f"{latency['32']['int8']:.3f} ms); size {report['size_ratio']:.3f}x "
        f"({report['size_bytes']['float']:,} -> {report['size_bytes']['int8']:,} bytes); "
        f"test accuracy {test['float']['accuracy']:.4f} -> {test['int8']['accuracy']:.4f} "
        f"(drop {drop:.2f} points)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="~/data/mnist")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--expdir", default=None)
    args = parser.parse_args()
    print(f"machine: {machine()}, 1 thread, {args.repeats} timed runs per figure")
    with tempfile.TemporaryDirectory() as temporary:
        expdir = args.expdir or temporary
        started = time.perf_counter()
        lenet = reused(expdir, "lenet5") or train("lenet5.yml", args.epochs, args.data, expdir)
        ffn = reused(expdir, "ffn") or train("ffn.yml", args.epochs, args.data, expdir)
        print(f"runs: {lenet}, {ffn} ({time.perf_counter() - started:.0f} s to train or find)")
        static = quantize(lenet, "static", repeats=args.repeats, force=True).report
        print(quantized_line("LeNet-5", static))
        dynamic = quantize(ffn, "dynamic", repeats=args.repeats, force=True).report
        print(quantized_line("FFN 784-256-128-10", dynamic))
        onnx = export(lenet, "onnx", repeats=args.repeats, force=True, int8=True).report
        for batch, entry in onnx["latency_ms"].items():
            print(
                f"LeNet-5 ONNX Runtime float, batch {batch}: torch/ORT time "
                f"{entry['speedup']:.2f}x ({entry['torch_eager']:.3f} -> "
                f"{entry['onnxruntime']:.3f} ms)"
            )
        print(f"LeNet-5 ONNX max abs difference: {onnx['check']['max_abs_difference']:.3g}")
        int8 = onnx["int8"]
        for batch, entry in int8["latency_ms"].items():
            print(
                f"LeNet-5 ONNX Runtime int8 (QDQ), batch {batch}: float/int8 time "
                f"{entry['speedup']:.2f}x ({entry['float']:.3f} -> {entry['int8']:.3f} ms)"
            )
        print(
            f"LeNet-5 ONNX int8: size {int8['bytes'] / int8['float_bytes']:.3f}x, top-1 "
            f"agreement with float {int8['top1_agreement_with_float']:.4f}"
        )
        with open("/proc/loadavg", encoding="utf-8") as load:
            print(f"load average at the end: {load.read().split()[0]}")


if __name__ == "__main__":
    main()
