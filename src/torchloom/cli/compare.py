"""`loom compare RUN_A RUN_B ... [-o OUT.html] [--force]`: runs side by side on one page."""

from __future__ import annotations

import argparse

from torchloom.analysis.compare import write_comparison


def run(args: argparse.Namespace) -> int:
    print(f"written: {write_comparison(args.run_dirs, args.output, force=args.force)}")
    return 0
