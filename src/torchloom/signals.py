"""The signals that stop a command as Ctrl-C does (a training run saves last.pt and ends
`interrupted`; a search queues its running trials again): SIGTERM (a scheduler, `kill`) and
SIGHUP (a closed terminal or SSH session). A command started to ignore SIGHUP (`nohup`) keeps
ignoring it, as the user asked. This module imports nothing heavy: the `loom` command reads
it before any subcommand imports torch."""

from __future__ import annotations

import signal


def terminating_signals() -> tuple[int, ...]:
    """SIGTERM, and SIGHUP unless this process ignores it."""
    hangup = getattr(signal, "SIGHUP", None)  # not on Windows
    if hangup is None or signal.getsignal(hangup) is signal.SIG_IGN:
        return (signal.SIGTERM,)
    return (signal.SIGTERM, hangup)
