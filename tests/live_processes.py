"""Whether a process still runs, as the tests of "no child outlives the command" ask it
(Linux: /proc)."""

from __future__ import annotations

from pathlib import Path


def alive(pid: int) -> bool:
    """Whether `pid` runs: a zombie (exited, not yet waited for) or a dead task does not."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def children(pid: int) -> set[int]:
    """The pids of `pid`'s children now (every thread's)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found |= {int(child) for child in (task / "children").read_text().split()}
        except OSError:
            continue
    return found
