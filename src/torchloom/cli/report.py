"""`loom report RUN_DIR`: write RUN_DIR/report.html, one self-contained page about a run."""

from __future__ import annotations

import argparse

from torchloom.analysis.html_report import write_report


def run(args: argparse.Namespace) -> int:
    for run_dir in args.run_dirs:
        print(f"written: {write_report(run_dir)}")
    return 0
