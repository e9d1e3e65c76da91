"""`loom ARGV...` run in the test's own process: `torchloom.cli.main.main(argv)` returns the
exit status, and pytest's `capsys` holds what it printed. A check of what a command says or
refuses needs no process of its own, whose start (torch's imports) costs 3 to 5 s of CPU on
a slow machine; only checks of a real process (its signals, its exit, its imports, an
uncaught traceback) start one."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from torchloom.cli.main import main


@dataclass
class Result:
    status: int
    out: str
    err: str


def run_loom(capsys: pytest.CaptureFixture[str], *argv: str) -> Result:
    """`loom ARGV...` in this process: its exit status and what it printed."""
    capsys.readouterr()  # drop anything printed before
    try:
        status = main(list(argv))
    except SystemExit as exit_:  # argparse's own errors (usage) and --help
        status = exit_.code if isinstance(exit_.code, int) else 1
    captured = capsys.readouterr()
    return Result(status, captured.out, captured.err)
