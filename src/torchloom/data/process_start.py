"""How torchloom starts the processes that make samples (loader workers, reservoir workers).

Forked where the platform can fork: a forked worker shares the parent's dataset (nothing is
pickled, nothing copied until written), as a worker of a run started by torchrun is. A
process that the elastic launcher started is itself spawned, and its default start method is
then `spawn`, which pickles the dataset into every worker: a task holds its build context's
closures, which cannot be pickled (`loom train --nproc 2` with `num_workers: 1` died at its
first batch), and a large in-memory dataset would be copied per worker.

A worker hands each batch's tensors to its parent as file descriptors, through a Unix socket
that multiprocessing makes in a `pymp-XXXXXXXX` folder of the temporary folder. A socket's
path has at most 107 bytes on Linux (103 on macOS): under a longer TMPDIR the worker's
sending thread failed, printed a traceback, dropped the batch, and the run waited for it
forever (a Slurm job's TMPDIR, or a test's, is often that deep). Python 3.14 falls back to
/tmp for these sockets (cpython#132124); this does the same on the Pythons we support.

Whatever else stops a worker's sending thread from sending a batch (a sample that cannot be
pickled: a task's stream holding a lock, a file or a connection) made multiprocessing print
the error and drop the batch, and the run waited for it for ever, deaf to a first Ctrl-C:
the batch's place now carries a data error that says why (`LoaderQueue`)."""

from __future__ import annotations

import contextlib
import copy
import functools
import multiprocessing
import multiprocessing.context
import multiprocessing.queues
import multiprocessing.util
import os
import sys
import tempfile
from typing import Any

from torchloom.errors import DataError, StorageError

# sun_path holds 108 bytes on Linux, 104 on macOS and the BSDs, a final NUL included.
SOCKET_PATH_MAX = 107 if sys.platform.startswith("linux") else 103
# What multiprocessing adds to its base folder: its own folder, then the socket, each with 8
# random characters (tempfile's names).
SOCKET_FOLDER_NAME = "/pymp-XXXXXXXX"
SOCKET_NAME = "/listener-XXXXXXXX"
# The longest temporary folder (in bytes) whose sockets fit: 75 on Linux.
TEMPORARY_FOLDER_MAX = SOCKET_PATH_MAX - len(SOCKET_FOLDER_NAME + SOCKET_NAME)
# Where the sockets go when the temporary folder's path is too long (as Python 3.14 does).
SHORT_TEMPORARY_FOLDERS = ("/tmp", "/var/tmp")


def worker_context() -> Any:
    """The multiprocessing context sample-making workers start in, once this process's
    socket folder is one whose sockets' paths fit (the workers inherit it); its queues are
    `LoaderQueue`s."""
    socket_folder()
    if "fork" in multiprocessing.get_all_start_methods():
        return ForkLoaderContext()
    return SpawnLoaderContext()


class LoaderQueue(multiprocessing.queues.Queue):
    """A queue whose (index, batch) item, as torch's DataLoader workers put it, arrives as a
    DataError for that index when the sending thread cannot send it. Through the hook
    multiprocessing keeps for this (concurrent.futures overrides it too); any other item
    is dropped with its error printed, as before."""

    def _on_queue_feeder_error(self, e: Exception, obj: object) -> None:
        from torch._utils import ExceptionWrapper  # what torch raises again in the run
        from torch.utils.data import get_worker_info

        worker = get_worker_info()  # None outside a loader worker (the run's index queues)
        batch = isinstance(obj, tuple) and len(obj) == 2 and type(obj[0]) is int
        if worker is None or not batch:
            super()._on_queue_feeder_error(e, obj)  # type: ignore[misc]
            return
        index: int = obj[0]  # type: ignore[index]
        data: Any = obj[1]  # type: ignore[index]
        if isinstance(data, ExceptionWrapper):
            # The worker's own error, of a class pickle cannot name (one defined in a
            # function): the same text, as a RuntimeError.
            if data.exc_type is RuntimeError:
                super()._on_queue_feeder_error(e, obj)  # type: ignore[misc]
                return
            data = copy.copy(data)
            data.exc_type = RuntimeError
            replacement = (index, data)
        else:
            try:
                raise DataError.at(
                    "",
                    "a batch",
                    f"cannot be handed to the run: {type(e).__name__}: {e}",
                    "every stream of a sample must be one that pickle can copy, as tensors, "
                    "numbers and strings are, to leave a loader worker; or set num_workers: 0",
                ) from e
            except DataError:  # torch's words, which LoomError reads back (errors.py)
                where = f"in DataLoader worker process {worker.id}"
                replacement = (index, ExceptionWrapper(where=where))
        with contextlib.suppress(ValueError):  # closed: the loader is gone, no one waits
            self.put(replacement)


class _LoaderQueues:
    """A multiprocessing context whose queues are LoaderQueues (at module level: a DataLoader
    that holds it can be pickled)."""

    def Queue(self, maxsize: int = 0) -> LoaderQueue:
        return LoaderQueue(maxsize, ctx=self.get_context())  # type: ignore[attr-defined]


class SpawnLoaderContext(_LoaderQueues, multiprocessing.context.SpawnContext):
    pass


if sys.platform != "win32":  # no fork there

    class ForkLoaderContext(_LoaderQueues, multiprocessing.context.ForkContext):
        pass


@functools.cache
def socket_folder() -> str:
    """The folder multiprocessing makes this process's sockets in (made now if not yet, under
    the temporary folder or, where that path is too long, under /tmp); StorageError if
    their paths would still be too long. Once a process: multiprocessing keeps its folder."""
    given = tempfile.gettempdir()
    base = next(
        (
            folder
            for folder in (given, *SHORT_TEMPORARY_FOLDERS)
            if _fits(folder + SOCKET_FOLDER_NAME)
            and os.path.isdir(folder)
            and os.access(folder, os.W_OK | os.X_OK)
        ),
        given,
    )
    chosen, tempfile.tempdir = tempfile.tempdir, base
    try:  # made once per process, under tempfile's folder (this call's choice, if first)
        folder = multiprocessing.util.get_temp_dir()
    finally:
        tempfile.tempdir = chosen
    if not _fits(folder):
        raise StorageError.at(
            "",
            f"multiprocessing's folder '{folder}'",
            "is too long for the sockets through which loader and reservoir workers hand over "
            f"batches (a socket's path has at most {SOCKET_PATH_MAX} bytes; the temporary "
            f"folder is '{given}')",
            f"set TMPDIR to a writable folder of at most {TEMPORARY_FOLDER_MAX} bytes, or "
            "num_workers: 0 and no reservoir workers",
        )
    return folder


def _fits(folder: str) -> bool:
    return len(os.fsencode(folder + SOCKET_NAME)) <= SOCKET_PATH_MAX
