"""`loom export RUN_DIR --format onnx|pt2|safetensors [...]`: the run's tensor graph, checked,
written to RUN_DIR/exports/<format>/ (see torchloom/deploy/export.py)."""

from __future__ import annotations

import argparse

from torchloom.deploy.export import export


def run(args: argparse.Namespace) -> int:
    result = export(
        args.run_dir,
        args.format,
        outputs=args.outputs,
        inputs=args.inputs,
        repeats=args.repeats,
        int8=args.int8,
        aoti=args.aoti,
        opset=args.opset,
        dynamic_batch=args.dynamic_batch,
        checkpoint=args.checkpoint,
        force=args.force,
    )
    report = result.report
    graph = report["graph"]
    print(f"graph: {', '.join(graph['inputs'])} -> {', '.join(graph['outputs'])}")
    print(f"file: {report['file']} ({report['bytes']:,} bytes)")
    check = report.get("check")
    if check:
        tolerance = f" (tolerance {check['tolerance']:g})" if "tolerance" in check else ""
        print(f"max abs difference to torch: {check['max_abs_difference']:.3g}{tolerance}")
    for batch, entry in report.get("latency_ms", {}).items():
        print(
            f"latency batch {batch}: torch {entry['torch_eager']:.3f} ms, ONNX Runtime "
            f"{entry['onnxruntime']:.3f} ms ({entry['speedup']:.2f}x, 1 thread)"
        )
    aoti = report.get("aoti")
    if aoti:
        print(f"AOTInductor package: {aoti['file']} ({aoti['bytes']:,} bytes)")
        for batch, entry in aoti["latency_ms"].items():
            print(
                f"AOTInductor latency batch {batch}: torch {entry['torch_eager']:.3f} ms, "
                f"package {entry['aoti']:.3f} ms ({entry['speedup']:.2f}x, 1 thread)"
            )
    int8 = report.get("int8")
    if int8:
        print(
            f"int8 ONNX: {int8['file']} ({int8['bytes']:,} bytes), top-1 agreement with float "
            f"{int8['top1_agreement_with_float']:.4f}"
        )
        for batch, entry in int8["latency_ms"].items():
            print(
                f"int8 latency batch {batch}: ONNX Runtime float {entry['float']:.3f} ms, int8 "
                f"{entry['int8']:.3f} ms ({entry['speedup']:.2f}x, 1 thread)"
            )
    print(f"written to: {result.folder}")
    return 0
