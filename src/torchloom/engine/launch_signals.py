"""Signals that reach `loom train --nproc N`'s launcher: passed on to every worker, and, after
a second one, the workers stopped at once even where they cannot take a signal."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING

from torchloom.signals import terminating_signals

if TYPE_CHECKING:
    from torchloom.engine.launch import Handoff


class PassedOn:
    """Signals received by the launcher, passed on to every worker (each signal once to
    each worker, also to one that writes its pid after the signal came)."""

    GRACE_SECONDS = 10.0  # for a worker to start and write its pid (importing torch: ~3 s)
    # After a second signal, for the workers to stop at once as they were asked; a worker
    # waiting inside a collective (a peer gone, collectives that do not match) runs no
    # Python, never sees the signals passed on, and is killed.
    KILL_AFTER_SECONDS = 5.0

    def __init__(self, handoff: Handoff) -> None:
        self.handoff = handoff
        self.received: list[int] = []
        self.delivered: dict[int, int] = {}
        self.first_at: float | None = None
        self.again_at: float | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        # Recorded only: `wait_for`'s loop delivers (within 0.2 s). A handler that delivered
        # too could interrupt that loop mid-delivery and send a worker the signal twice.
        self.received.append(signum)
        now = time.monotonic()
        if self.first_at is None:
            self.first_at = now
        elif self.again_at is None:
            self.again_at = now

    def deliver(self) -> None:
        for pid in self.handoff.pids():
            done = self.delivered.get(pid, 0)
            for signum in self.received[done:]:
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:  # that worker has ended
                    break
            self.delivered[pid] = len(self.received)

    def wait_for(self, thread: threading.Thread) -> None:
        while thread.is_alive():
            thread.join(0.2)
            self.deliver()
            if self.again_at is not None and time.monotonic() > (
                self.again_at + self.KILL_AFTER_SECONDS
            ):
                for pid in self.handoff.pids():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                for child in multiprocessing.active_children():
                    child.kill()
                raise KeyboardInterrupt
            if self.first_at is None or self.delivered:
                continue
            # A signal and no worker to pass it to. None spawned: the rendezvous is waiting
            # for other machines; stop here. Spawned but silent past the grace: stop them.
            spawned = multiprocessing.active_children()
            if not spawned or time.monotonic() - self.first_at > self.GRACE_SECONDS:
                for child in spawned:
                    child.kill()
                raise KeyboardInterrupt


@contextmanager
def passed_on(handoff: Handoff) -> Iterator[PassedOn]:
    forward = PassedOn(handoff)
    main = threading.current_thread() is threading.main_thread()
    stopping = (signal.SIGINT, *terminating_signals())
    previous = {s: signal.signal(s, forward) for s in stopping} if main else {}
    try:
        yield forward
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# For a worker whose launcher is gone to stop as asked (its step, or the validation pass it
# was in, ended and last.pt saved): past it, the worker is killed (see stop_when_gone).
ORPHAN_GRACE_SECONDS = 600.0


def stop_when_gone(launcher: int, grace: float = ORPHAN_GRACE_SECONDS) -> None:
    """In a worker (a thread of its own): once its launcher (pid `launcher`) is gone, killed
    with SIGKILL included, one SIGTERM to itself, which saves last.pt and stops the run as
    Ctrl-C does; SIGKILL `grace` seconds later if it still runs. A run stops at the end of a
    step, which a worker waiting for a batch that never comes (a loader worker's lost
    batch) or for a peer inside a collective never reaches: such workers, and their loader
    workers (whose parent-death signal is SIGKILL), outlived a killed command for good."""
    while os.getppid() == launcher:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace)
    os.kill(os.getpid(), signal.SIGKILL)
