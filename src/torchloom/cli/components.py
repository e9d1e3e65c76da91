"""`loom components [NAME]`: the registered components by family, or one described in full."""

from __future__ import annotations

import argparse

from torchloom.cli.table import format_table
from torchloom.core.describe import describe_component, first_line
from torchloom.core.registry import all_components, resolve

FAMILY_ORDER = ("task", "model", "loss", "statistic", "component")


def run(args: argparse.Namespace) -> int:
    if args.name:
        print(describe_component(resolve(args.name), args.name))
        return 0
    components = all_components()
    for family in FAMILY_ORDER:
        rows = [
            [name, first_line(cls)]
            for name, cls in sorted(components.items())
            if cls.family == family
        ]
        if rows:
            print(f"{family}s" if family != "component" else "utilities")
            print(format_table(["name", "description"], rows))
            print()
    print("`loom components NAME` describes one: parameters, streams, globals, YAML snippet.")
    return 0
