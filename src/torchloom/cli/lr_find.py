"""`loom lr-find CONFIG [overrides]`: the learning-rate range test (Smith 2015) on a config's
training section, in a run folder of its own; prints the suggested rate and the folder."""

from __future__ import annotations

import argparse

from torchloom.analysis.lr_find import lr_find


def run(args: argparse.Namespace) -> int:
    result = lr_find(
        args.config,
        args.overrides,
        start_lr=args.start_lr,
        end_lr=args.end_lr,
        steps=args.steps,
        expdir=args.expdir,
        device=args.device,
        disable=args.disable,
    )
    rates, divergence = result.learning_rates, result.divergence
    diverged = (
        f"divergence: began at step {divergence.began + 1} (rate {rates[divergence.began]:.3g}): "
        f"{divergence.reason}"
        if divergence is not None
        else f"divergence: none up to rate {rates[-1]:.3g}"
    )
    print(
        "\n".join(
            [
                f"suggested learning rate: {result.suggested_lr:.3g} "
                f"({result.rule}"
                + (", before the raw loss diverged)" if divergence is not None else ")"),
                diverged,
                f"steps: {len(rates)} ({rates[0]:.3g} to {rates[-1]:.3g}), "
                f"stopped: {result.stopped}",
                f"run folder: {result.run_dir}",
            ]
        )
    )
    return 0
