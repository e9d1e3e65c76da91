"""An AOTInductor package of an exported program (`loom export --format pt2 --aoti`):
`torch._inductor.aoti_compile_and_package` compiles the graph to a shared library with the
machine's C++ compiler, so that a deployment runs it without Python model code
(`torch._inductor.aoti_load_package(path)(*inputs)` from Python, or libtorch's
`AOTIModelPackageLoader` from C++). Checked against eager outputs and timed against them."""

from __future__ import annotations

import functools
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from torchloom.deploy.graph import InferenceGraph
from torchloom.deploy.measure import largest_difference, paired_latency_ms, ratio, timed_batch
from torchloom.deploy.onnx_export import FLOAT_TOLERANCE, exporter_reason
from torchloom.errors import DeployError


def aoti_package(
    program: Any,
    graph: InferenceGraph,
    batches: Sequence[Sequence[torch.Tensor]],
    path: Path,
    repeats: int,
    sizes: Sequence[int],
) -> dict[str, Any]:
    if shutil.which("c++") is None and shutil.which("g++") is None:
        raise DeployError.at(
            "command line",
            "--aoti",
            "AOTInductor needs a C++ compiler, and none (c++, g++) is on the PATH",
            "install one (Debian: g++), or leave out --aoti",
        )
    try:
        torch._inductor.aoti_compile_and_package(program, package_path=str(path))
        compiled = torch._inductor.aoti_load_package(str(path))
    except Exception as error:
        raise DeployError.at(
            "", "AOTInductor", f"compiling failed: {exporter_reason(error)}"
        ) from error
    worst = 0.0
    with torch.no_grad():
        for inputs in batches:
            for want, got in zip(graph(*inputs), compiled(*inputs), strict=True):
                worst = max(worst, largest_difference(want, got, "AOTInductor check"))
    if not worst <= FLOAT_TOLERANCE:
        raise DeployError.at(
            "",
            "AOTInductor check",
            f"the package's outputs differ from eager torch's by up to {worst:.3g} "
            f"(tolerance {FLOAT_TOLERANCE:g})",
        )
    latency = {}
    for size in sizes:
        inputs = timed_batch(batches[0], size)
        medians = paired_latency_ms(
            {
                "eager": functools.partial(graph, *inputs),
                "aoti": functools.partial(compiled, *inputs),
            },
            repeats,
        )
        latency[str(size)] = {
            "torch_eager": round(medians["eager"], 4),
            "aoti": round(medians["aoti"], 4),
            "speedup": ratio(medians["eager"], medians["aoti"]),
        }
    return {
        "file": path.name,
        "bytes": path.stat().st_size,
        "max_abs_difference": worst,
        "tolerance": FLOAT_TOLERANCE,
        "latency_ms": latency,
        "load": "torch._inductor.aoti_load_package(path)(*inputs)",
    }
