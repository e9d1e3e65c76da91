"""`loom process CONFIG|RUN_DIR [--section test] [--checkpoint best|last|PATH]`."""

from __future__ import annotations

import argparse

from torchloom.engine.processor import process
from torchloom.engine.reporting import format_statistics


def run(args: argparse.Namespace) -> int:
    disable = [name.strip() for name in args.disable.split(",") if name.strip()]
    result = process(
        args.source,
        args.overrides,
        section=args.section,
        checkpoint=args.checkpoint,
        expdir=args.expdir,
        device=args.device,
        disable=disable,
        checkpoint_strict=args.checkpoint_strict,
    )
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
