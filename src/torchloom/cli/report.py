"""`loom report RUN_DIR`: write RUN_DIR/report.html, one self-contained page about a run;
for a search folder (`loom search`'s), rebuild its trials.csv, best.yml and search.html."""

from __future__ import annotations

import argparse
from pathlib import Path

from torchloom.analysis.html_report import write_report
from torchloom.analysis.run_reading import read_run


def run(args: argparse.Namespace) -> int:
    for run_dir in args.run_dirs:
        if (Path(run_dir) / "search.json").is_file():
            from torchloom.search.page import write_page
            from torchloom.search.record import read_record
            from torchloom.search.results import write_results

            record = read_record(Path(run_dir))
            results = write_results(Path(run_dir), record)
            print(f"written: {write_page(Path(run_dir), record, results)}")
        else:
            run_folder = read_run(run_dir)
            print(f"written: {write_report(run_folder)}")
            for problem in run_folder.unreadable_statistics:
                print(f"  not shown, cannot be read: {problem}")
    return 0
