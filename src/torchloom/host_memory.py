"""CPU tensors of 2 MiB or more on transparent huge pages: torch's THP_MEM_ALLOC_ENABLE.

torch's CPU allocator takes every tensor from the C library's posix_memalign. glibc serves a
block above its mmap threshold (never more than 32 MiB) with a fresh mmap and unmaps it when
it is freed, so a training step whose activations are larger gets new pages for them every
time, and the kernel faults in and zeroes every 4 KiB page: the Sort-of-CLEVR Relation
Network's step (41 MiB activations) spent a third of its time in the kernel. With
THP_MEM_ALLOC_ENABLE=1, torch starts its blocks of 2 MiB and more at page boundaries and advises
the kernel to back them with 2 MiB pages: 512 times fewer faults (benchmarks/cpu_allocator.py:
that step in 0.74 times the time, LeNet-5's unchanged).

(Keeping freed blocks in glibc's heap instead, by raising its mmap threshold with mallopt, is no
answer: glibc 2.36 did not reuse a freed 64 MiB block for the next aligned allocation of the
same size but grew the heap, and a Sort-of-CLEVR training process grew by a GiB a minute.)

torch reads the variable once, when it starts, so it is set before torch is imported: the `loom`
command does so; a Python program sets it itself. This module must not import torch.

`available_memory()`: the host memory a run can still take, for checks that refuse what
cannot fit before it is allocated (an asynchronous reservoir's size).
"""

from __future__ import annotations

import os
import sys

VARIABLE = "THP_MEM_ALLOC_ENABLE"


def prefer_huge_page_tensors() -> bool:
    """Set THP_MEM_ALLOC_ENABLE=1 unless the environment has it already (a user's 0 stays).
    True when it was set here; False when torch is already imported (too late) or the
    environment decided."""
    if "torch" in sys.modules or VARIABLE in os.environ:
        return False
    os.environ[VARIABLE] = "1"
    return True


def huge_page_tensors_in_effect() -> bool:
    """Whether torch runs with THP_MEM_ALLOC_ENABLE, seen in what it does: it then puts every
    CPU block of 2 MiB or more at a page boundary, where glibc's mmap'd blocks start 64 bytes
    in and heap blocks anywhere."""
    import torch  # only here: importing this module must leave torch unimported

    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    blocks = [torch.empty(2**19 + 1024 * n) for n in range(4)]  # 2 MiB and a little more
    return all(block.data_ptr() % page == 0 for block in blocks)


def available_memory() -> int | None:
    """Bytes of memory this process can still take without swapping: the kernel's
    MemAvailable, and no more than its cgroup's limit leaves (a container, a Slurm job);
    None where neither is known."""
    found: list[int] = []
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            found += [
                int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:")
            ]
    except (OSError, ValueError, IndexError):
        pass
    try:  # cgroup v2: the limit, less what the group uses already ("max": no limit)
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as limit:
            text = limit.read().strip()
        with open("/sys/fs/cgroup/memory.current", encoding="ascii") as current:
            if text != "max":
                found.append(max(0, int(text) - int(current.read().strip())))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def short_of_memory(need: int) -> int | None:
    """The memory available when `need` bytes would take more than half of it (a check that
    refuses what cannot fit before it is allocated leaves the rest to the run); None when it
    fits, or when the machine does not say."""
    available = available_memory()
    return available if available is not None and need > available // 2 else None


def out_of_host_memory(error: BaseException) -> bool:
    """Whether `error` is an allocation the host's memory refused: Python's MemoryError, or
    torch's CPU allocator, whose refusals are plain RuntimeErrors told apart only by their
    words ("can't allocate memory", a C++ std::bad_alloc)."""
    if isinstance(error, MemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and (
        "can't allocate memory" in text or "bad_alloc" in text
    )
