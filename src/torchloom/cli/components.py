"""`loom components [NAME]`: the registered components by family, or one described in full.

The list is read from the components' source (core/catalog.py), so it imports no torch and
prints in a fraction of a second; a component whose source does not say its family is
imported. Describing one imports it: its parameters and streams are code.
"""

from __future__ import annotations

import argparse

from torchloom.cli.table import format_table
from torchloom.core.catalog import Summary, summaries

FAMILY_HEADINGS = {
    "task": "tasks",
    "model": "models",
    "loss": "losses",
    "statistic": "statistics",
    "component": "utilities",
}


def run(args: argparse.Namespace) -> int:
    if args.name:
        from torchloom.core.describe import describe_component
        from torchloom.core.registry import resolve

        print(describe_component(resolve(args.name), args.name))
        return 0
    listed = {name: summary or _imported(name) for name, summary in summaries().items()}
    for family, heading in FAMILY_HEADINGS.items():
        rows = [
            [name, summary.description]
            for name, summary in sorted(listed.items())
            if summary.family == family
        ]
        if rows:
            print(heading)
            print(format_table(["name", "description"], rows))
            print()
    print("`loom components NAME` describes one: parameters, streams, globals, YAML snippet.")
    return 0


def _imported(name: str) -> Summary:
    from torchloom.core.describe import first_line
    from torchloom.core.registry import resolve

    cls = resolve(name)
    return Summary(cls.family, first_line(cls))
