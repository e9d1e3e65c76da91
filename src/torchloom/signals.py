"""The signals that stop a command as Ctrl-C does (a training run saves last.pt and ends
`interrupted`; a search queues its running trials again): SIGTERM (a scheduler, `kill`) and
SIGHUP (a closed terminal or SSH session). A command started to ignore SIGHUP (`nohup`) keeps
ignoring it, as the user asked. This module imports nothing heavy: the `loom` command reads
it before any subcommand imports torch.

A stop signal interrupts whatever runs, and what runs may turn the KeyboardInterrupt into
another exception: on Python 3.11 a class body's `__set_name__` wraps it in RuntimeError, and
a module whose import it cut short fails every later import of it with ImportError or
AttributeError. So the signals are also recorded (`stop_asked`): code that counts exceptions
as failures (a search's trials) asks it first, and a stop stays a stop.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType


def terminating_signals() -> tuple[int, ...]:
    """SIGTERM, and SIGHUP unless this process ignores it."""
    hangup = getattr(signal, "SIGHUP", None)  # not on Windows
    if hangup is None or signal.getsignal(hangup) is signal.SIG_IGN:
        return (signal.SIGTERM,)
    return (signal.SIGTERM, hangup)


def set_parent_death_signal(signum: int) -> None:
    """Ask Linux to send this process `signum` when its parent exits (0: no signal at all);
    elsewhere nothing (callers check their parent themselves)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import ctypes.util

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.prctl(1, int(signum), 0, 0, 0)  # PR_SET_PDEATHSIG


_stops: list[int] = []  # stop signals received while `stopping_on_signals` is in effect
_depth = 0
_held_from: int | None = None  # len(_stops) when `stops_held` began; None outside it


def record_stop(signum: int) -> None:
    """Note a stop signal handled elsewhere (a training run's graceful stop)."""
    _stops.append(signum)


def stop_asked() -> bool:
    """Whether a stop signal came while `stopping_on_signals` is in effect (the outermost
    one clears the record when it is entered)."""
    return bool(_stops)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    record_stop(signum)
    if _held_from is not None and len(_stops) - _held_from < 2:
        return  # raised when the held block ends (a second signal: at once)
    raise KeyboardInterrupt  # SIGTERM, SIGHUP: as Ctrl-C, in every phase


@contextlib.contextmanager
def stops_held() -> Iterator[None]:
    """A block that a stop signal must not cut in two (a search claiming a trial and naming
    its process: cut between, the trial is left RUNNING with no one to end it): a signal
    during it is recorded and raised as KeyboardInterrupt at its end, a second one at once
    (a block stuck on a database must still stop). Where `stopping_on_signals` handles the
    signals, in the main thread (signals are handled there alone); a block inside another
    holds nothing more."""
    global _held_from
    if _held_from is not None or threading.current_thread() is not threading.main_thread():
        yield
        return
    _held_from = len(_stops)
    try:
        yield
    except BaseException as error:
        held_from, _held_from = _held_from, None
        if len(_stops) > held_from and not isinstance(error, KeyboardInterrupt):
            raise KeyboardInterrupt from error  # the stop asked for, not what the block met
        raise
    # Reset first: a signal from here on raises at once, and none is lost in between.
    held_from, _held_from = _held_from, None
    if len(_stops) > held_from:
        raise KeyboardInterrupt


def _quiet_about_interrupts(hook: object) -> object:
    """`sys.unraisablehook` that says nothing of a KeyboardInterrupt raised where Python
    cannot raise it (a weakref callback, a __del__), `hook` for anything else. Python prints
    those as "Exception ignored in: ..." with a traceback, at a Ctrl-C that the record above
    carries to the command all the same."""

    def unraisable(info: object) -> None:
        if not isinstance(getattr(info, "exc_value", None), KeyboardInterrupt):
            hook(info)  # type: ignore[operator]

    return unraisable


@contextlib.contextmanager
def stopping_on_signals() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP (unless ignored) raise KeyboardInterrupt, and are recorded.
    SIGINT even where the process started with it ignored, as a script's background job
    does (`loom train ... &`): a training run stops on it in any case (engine/state.py,
    StopSignals), and so does every command, in every phase. In the main thread only
    (elsewhere signals cannot be handled); the handlers are restored at the end."""
    global _depth
    if _depth == 0:
        _stops.clear()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        stopping = (signal.SIGINT, *terminating_signals())
        previous = {signum: signal.signal(signum, _interrupt) for signum in stopping}
    unraisable = sys.unraisablehook
    sys.unraisablehook = _quiet_about_interrupts(unraisable)  # type: ignore[assignment]
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        sys.unraisablehook = unraisable
        for signum, handler in previous.items():
            signal.signal(signum, handler)
