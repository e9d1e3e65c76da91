"""`loom config CONFIG [overrides]`: the merged, resolved config, as YAML `loom check` accepts."""

from __future__ import annotations

import argparse

from torchloom.config import dump_config, load_config


def run(args: argparse.Namespace) -> int:
    loaded = load_config(args.config, args.overrides)
    print(dump_config(loaded.data), end="")
    return 0
