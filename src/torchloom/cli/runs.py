"""`loom runs [EXPDIR] [--sort STAT] [--limit N]`: a table of runs for model selection, and
one of the searches (`loom search`) under EXPDIR/searches."""

from __future__ import annotations

import argparse
from pathlib import Path

from torchloom.analysis.runs_table import list_runs, sort_runs, table_cells
from torchloom.cli.table import format_table
from torchloom.errors import ConfigError


def run(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 1:
        raise ConfigError.at("", "--limit", f"must be at least 1, not {args.limit}")
    rows = list_runs(args.expdir)
    from torchloom.search.listing import HEADERS, list_searches

    searches = list_searches(args.expdir)
    if searches:
        print(format_table(HEADERS, searches))
        if rows:
            print()
    if not rows:
        if (Path(args.expdir) / "search.json").is_file():
            trials = Path(args.expdir) / "trials"
            print(f"{args.expdir} is a search folder: its trials' runs are under {trials}")
            print(f"(loom runs {trials}; loom report {args.expdir} for the search's page)")
        elif not searches:
            print(f"no runs under {args.expdir} (a run is <expdir>/<pipeline>/<date>/summary.json)")
        return 0
    if args.sort:
        rows = sort_runs(rows, args.sort, args.descending)
    if args.limit is not None:
        rows = rows[: args.limit]
    headers, cells, right = table_cells(rows, args.sort)
    print(format_table(headers, cells, align_right=right))
    return 0
