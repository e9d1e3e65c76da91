"""`loom lr-find CONFIG [overrides]`: the learning-rate range test (Smith 2015) on a config's
training section, in a run folder of its own; prints the suggested rate and the folder."""

from __future__ import annotations

import argparse

from torchloom.analysis.learning_rate import lr_find


def run(args: argparse.Namespace) -> int:
    result = lr_find(
        args.config,
        args.overrides,
        start_lr=args.start_lr,
        end_lr=args.end_lr,
        steps=args.steps,
        expdir=args.expdir,
        device=args.device,
        disable=[n.strip() for n in args.disable.split(",") if n.strip()],
    )
    print(
        "\n".join(
            [
                f"suggested learning rate: {result.suggested_lr:.3g} "
                "(steepest descent of the smoothed loss)",
                f"steps: {len(result.learning_rates)} "
                f"({result.learning_rates[0]:.3g} to {result.learning_rates[-1]:.3g}), "
                f"stopped: {result.stopped}",
                f"run folder: {result.run_dir}",
            ]
        )
    )
    return 0
