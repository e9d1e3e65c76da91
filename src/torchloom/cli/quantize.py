"""`loom quantize RUN_DIR --mode dynamic|static [...]`: int8 models measured against float,
written to RUN_DIR/quantized/<mode>/ (see torchloom/deploy/quantize.py)."""

from __future__ import annotations

import argparse

from torchloom.deploy.quantize import quantize


def run(args: argparse.Namespace) -> int:
    result = quantize(
        args.run_dir,
        args.mode,
        backend=args.backend,
        calibration_batches=args.calibration_batches,
        per_channel=args.per_channel,
        skip=[name.strip() for name in args.skip.split(",") if name.strip()],
        checkpoint=args.checkpoint,
        force=args.force,
        repeats=args.repeats,
        qat_epochs=args.qat_epochs,
        qat_lr=args.qat_lr,
    )
    report = result.report
    print(f"route: {report['route']}")
    if report["qat"]:
        print(f"fine-tuned {report['qat']['epochs']} epoch(s) in: {report['qat']['training_run']}")
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
