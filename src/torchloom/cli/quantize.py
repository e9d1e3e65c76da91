"""`loom quantize RUN_DIR --mode dynamic|static|qat [...]`: int8 models measured against
float, written to RUN_DIR/quantized/<mode>/ (see torchloom/deploy/quantize.py). A
quantization-aware fine-tuning stopped by a signal exits 130 with the command that continues
it (`--resume`)."""

from __future__ import annotations

import argparse
import sys

from torchloom.deploy.qat import FineTuningInterrupted, unfinished_fine_tuning
from torchloom.deploy.quantize import QuantizeResult, quantize
from torchloom.deploy.report import fine_tuned_text, graph_text


def run(args: argparse.Namespace) -> int:
    if args.mode == "qat" and not args.resume:
        unfinished = unfinished_fine_tuning(args.run_dir)
        if unfinished is not None:
            print(
                f"note: the fine-tuning run '{unfinished}' stopped before its end; this starts "
                "a new one (--resume continues that one)",
                file=sys.stderr,
            )
    try:
        result = _quantize(args)
    except FineTuningInterrupted as error:
        print(error.format(), file=sys.stderr)
        return 130
    report = result.report
    print(f"route: {report['route']}")
    print(f"timed graph (latency, layers' SQNR): {graph_text(report['graph'])}")
    if report["qat"]:
        print(f"fine-tuned {fine_tuned_text(report['qat'])} in: {report['qat']['training_run']}")
    size = report["size_bytes"]
    print(f"weights: {size['float']:,} -> {size['int8']:,} bytes ({report['size_ratio']:.3f}x)")
    for batch, entry in report["latency_ms"].items():
        print(
            f"latency batch {batch}: {entry['float']:.3f} -> {entry['int8']:.3f} ms "
            f"(float/int8 time {entry['speedup']:.2f}x, 1 thread)"
        )
    for section, values in report["statistics"].items():
        before, after = values["float"], values["int8"]
        shown = [
            f"{k} {before[k]:.4f} -> {after[k]:.4f}"
            for k in before
            if k != "samples"
            and not k.startswith("loss_")
            and isinstance(before[k], (int, float))
            and isinstance(after.get(k), (int, float))
        ]
        print(f"{section}: {', '.join(shown)}")
    left = [layer for layer in report["layers"] if not layer["quantized"]]
    for layer in left:
        print(f"left in float: {layer['name']} ({layer['kind']}): {layer['reason']}")
    print(f"written to: {result.folder}")
    return 0


def _quantize(args: argparse.Namespace) -> QuantizeResult:
    return quantize(
        args.run_dir,
        args.mode,
        backend=args.backend,
        calibration_batches=args.calibration_batches,
        per_channel=args.per_channel,
        skip=args.skip,
        checkpoint=args.checkpoint,
        force=args.force,
        repeats=args.repeats,
        qat_epochs=args.qat_epochs,
        qat_lr=args.qat_lr,
        resume=True if args.resume == "latest" else (args.resume or False),
    )
