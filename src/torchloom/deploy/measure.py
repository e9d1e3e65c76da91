"""Size, latency and output differences, measured the same way for every model a report
compares.

Latency: one thread (`torch.set_num_threads(1)`, restored after), no gradients, `warmup` calls
excluded, then the median of `repeats` timed calls (`time.perf_counter`). Size: the bytes of
the weights as `torch.save` writes them (what a deployment ships).
"""

from __future__ import annotations

import contextlib
import io
import math
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from torchloom.errors import DeployError


def check_repeats(repeats: int) -> None:
    """--repeats, refused before any work when no call would be timed."""
    if repeats < 1:
        raise DeployError.at("command line", "--repeats", f"must be at least 1, got {repeats}")


def timed_batch(inputs: Sequence[torch.Tensor], size: int) -> tuple[torch.Tensor, ...]:
    """The first `size` rows of every input, its rows repeated in turn when it has fewer (a
    split smaller than the batch timed): a figure said to be of batch 32 is timed at 32."""
    count = int(inputs[0].shape[0]) if inputs else 0
    if count >= size or count == 0:
        return tuple(t[:size] for t in inputs)
    rows = torch.arange(size) % count
    return tuple(t[rows.to(t.device)] for t in inputs)


@contextlib.contextmanager
def threads(count: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def median_latency_ms(
    call: Callable[[], Any], repeats: int = 30, warmup: int = 3, thread_count: int = 1
) -> float:
    """Median wall time of `call()` in milliseconds, on `thread_count` threads."""
    timings = []
    with threads(thread_count), torch.no_grad():
        for _ in range(warmup):
            call()
        for _ in range(repeats):
            started = time.perf_counter()
            call()
            timings.append((time.perf_counter() - started) * 1000.0)
    return statistics.median(timings)


def serialized_bytes(state: Mapping[str, Any]) -> int:
    """Bytes of `torch.save(state)`."""
    buffer = io.BytesIO()
    torch.save(dict(state), buffer)
    return len(buffer.getvalue())


def machine() -> str:
    """The CPU's model name where Linux says it, else what platform says."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def ratio(before: float, after: float) -> float:
    return round(before / after, 3) if after else float("inf")


def paired_latency_ms(
    calls: Mapping[str, Callable[[], Any]], repeats: int = 30, warmup: int = 3, block: int = 10
) -> dict[str, float]:
    """Median wall time (ms, one thread) of each call, the calls taking turns in blocks of
    `block` timed runs (each after one untimed run): a machine whose load changes during the
    measurement slows them alike, so their ratio holds where two measurements one after the
    other would not, while each block runs warm as a deployed model does (turns of single
    calls evict each other's weights from the caches: int8 LeNet-5 then measured 25% slower)."""
    timings: dict[str, list[float]] = {name: [] for name in calls}
    with threads(1), torch.no_grad():
        for call in calls.values():
            for _ in range(warmup):
                call()
        while any(len(values) < repeats for values in timings.values()):
            for name, call in calls.items():
                call()
                for _ in range(min(block, repeats - len(timings[name]))):
                    started = time.perf_counter()
                    call()
                    timings[name].append((time.perf_counter() - started) * 1000.0)
    return {name: statistics.median(values) for name, values in timings.items()}


def _float64(values: Any) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().to(torch.float64).numpy()
    return np.asarray(values, dtype=np.float64)


def largest_difference(reference: Any, candidate: Any, subject: str) -> float:
    """max |reference - candidate| (tensors or arrays), in float64: the one check of an
    export's outputs against eager torch's. `math.inf` when any difference is not finite (a
    NaN or an infinity on either side: `max(0.0, nan)` is 0.0, so a NaN must never reach a
    `max`); shapes that differ are a DeployError naming `subject`, never broadcast."""
    want, got = _float64(reference), _float64(candidate)
    if want.shape != got.shape:
        raise DeployError.at(
            "",
            subject,
            f"gave an output of shape {got.shape} where eager torch gave {want.shape}",
            "report it with the config; --outputs can narrow down the component",
        )
    if want.size == 0:
        return 0.0
    with np.errstate(invalid="ignore"):  # inf - inf is a NaN: what the next line looks for
        difference = np.abs(want - got)
    if not bool(np.isfinite(difference).all()):
        return math.inf
    return float(difference.max())
