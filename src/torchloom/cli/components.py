"""`loom components [NAME]`: the registered components by family, or one described in full."""

from __future__ import annotations

import argparse

from torchloom.cli.table import format_table
from torchloom.core.describe import describe_component, first_line
from torchloom.core.registry import all_components, resolve

FAMILY_HEADINGS = {
    "task": "tasks",
    "model": "models",
    "loss": "losses",
    "statistic": "statistics",
    "component": "utilities",
}


def run(args: argparse.Namespace) -> int:
    if args.name:
        print(describe_component(resolve(args.name), args.name))
        return 0
    components = all_components()
    for family, heading in FAMILY_HEADINGS.items():
        rows = [
            [name, first_line(cls)]
            for name, cls in sorted(components.items())
            if cls.family == family
        ]
        if rows:
            print(heading)
            print(format_table(["name", "description"], rows))
            print()
    print("`loom components NAME` describes one: parameters, streams, globals, YAML snippet.")
    return 0
