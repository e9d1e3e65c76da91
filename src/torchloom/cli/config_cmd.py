"""`loom config CONFIG [overrides]`: the merged, resolved config, as YAML `loom check` accepts."""

from __future__ import annotations

import argparse

from torchloom.config import dump_config, load_config
from torchloom.config.schema import CODE_FIRST_KEY, validate_sections


def run(args: argparse.Namespace) -> int:
    loaded = load_config(args.config, args.overrides)
    if CODE_FIRST_KEY not in loaded.data:  # a Trainer.fit run's record is shown as it is
        # Its sections checked, so that what it prints is a config `loom check` accepts
        # (`+training.bogus=1` was printed as if it were one).
        validate_sections(loaded.data, loaded.where)
    print(dump_config(loaded.data), end="")
    return 0
