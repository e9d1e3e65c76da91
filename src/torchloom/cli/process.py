"""`loom process CONFIG|RUN_DIR [--section test] [--checkpoint best|last|PATH]`."""

from __future__ import annotations

import argparse

from torchloom.deploy.quantized_folder import (
    is_quantized_folder,
    load_quantized,
    quantized_backend,
)
from torchloom.deploy.quantizer import quantized_engine
from torchloom.engine.processor import ProcessResult, process
from torchloom.engine.reporting import format_statistics
from torchloom.errors import ConfigError


def run(args: argparse.Namespace) -> int:
    if is_quantized_folder(args.source):
        return _quantized(args, args.disable)
    result = process(
        args.source,
        args.overrides,
        section=args.section,
        checkpoint=args.checkpoint,
        expdir=args.expdir,
        device=args.device,
        disable=args.disable,
        checkpoint_strict=args.checkpoint_strict,
    )
    return _print(args, result)


def _quantized(args: argparse.Namespace, disable: list[str]) -> int:
    """A `loom quantize` result folder: its int8 pipeline, on the CPU, with the quantized
    engine it was packed for; results go into a subfolder, as for a run folder."""
    refused = [
        (flag, value)
        for flag, value in (
            ("--checkpoint", args.checkpoint),
            ("--device", args.device if args.device not in (None, "cpu") else None),
            ("--disable", ",".join(disable) or None),
        )
        if value
    ]
    if refused:
        flag, _ = refused[0]
        raise ConfigError.at(
            "command line",
            flag,
            "does not apply to a quantized folder (int8 weights, CPU kernels)",
            "leave it out",
        )
    with quantized_engine(quantized_backend(args.source)):
        pipeline = load_quantized(args.source, args.overrides)
        result = process(
            args.source, args.overrides, section=args.section, device="cpu", prebuilt=pipeline
        )
    return _print(args, result)


def _print(args: argparse.Namespace, result: ProcessResult) -> int:
    print(f"{args.section}: {format_statistics(result.statistics)}")
    if result.weights is not None and not result.weights["complete"]:
        for name, entry in result.weights["components"].items():
            if entry["not_loaded"] or entry["ignored"]:
                print(
                    f"weights of '{name}': {len(entry['loaded'])} loaded, "
                    f"{len(entry['not_loaded'])} not loaded ({', '.join(entry['not_loaded'][:4])})"
                )
    print(f"written to: {result.folder}")
    return 0
