"""`loom train CONFIG [overrides]` and `loom train --resume RUN_DIR`."""

from __future__ import annotations

import argparse

from torchloom.analysis.build import build_hooks
from torchloom.engine.run_folder import RunResult, check_run_tag
from torchloom.engine.setup import prepare_training
from torchloom.engine.state import TrainOptions


def run(args: argparse.Namespace) -> int:
    check_run_tag(args.tag)  # before any data is read (create_run_folder checks it again)
    options = TrainOptions(
        expdir=args.expdir,
        tag=args.tag,
        device=args.device,
        quiet=args.quiet,
        tensorboard=args.tensorboard,
        disable=[n.strip() for n in args.disable.split(",") if n.strip()],
        hook_factory=build_hooks,  # the config's analysis section
    )
    if args.resume and args.config:
        # argparse fills `config` positionally; with --resume it must be empty.
        args.overrides = [args.config, *args.overrides]
        args.config = None
    prepared = prepare_training(args.config, args.overrides, options, resume=args.resume)
    if isinstance(prepared, RunResult):
        print(finished_message(prepared))
        return 0
    result = prepared.run()
    summary = result.summary
    final = summary.get("final", {})
    lines = [
        f"status: {summary['status']} ({summary['reason']})",
        f"epochs: {summary['epochs']}, episodes: {summary['episodes']}, "
        f"wall time: {summary['wall_time_seconds']:.1f} s",
    ]
    for section in ("validation", "test"):
        if "accuracy" in final.get(section, {}):
            lines.append(f"{section} accuracy: {final[section]['accuracy']:.4f}")
    lines.append(f"run folder: {result.run_dir}")
    print("\n".join(lines))
    return 130 if result.status == "interrupted" else 0


def finished_message(result: RunResult) -> str:
    summary = result.summary
    return "\n".join(
        [
            f"run already finished: {summary.get('status')} ({summary.get('reason')}); "
            "nothing to do",
            "to continue it, raise the condition that ended it, e.g. "
            f"loom train --resume {result.run_dir} training.terminal_conditions.epoch_limit=N",
            f"run folder: {result.run_dir}",
        ]
    )
