"""ONNX through torch's dynamo exporter (`torch.onnx.export(..., dynamo=True)`, which needs the
`onnx` and `onnxscript` packages), checked in ONNX Runtime against the eager graph on real
batches, and timed in both."""

from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchloom.core.component import Component
from torchloom.deploy.graph import InferenceGraph
from torchloom.deploy.measure import largest_difference
from torchloom.errors import DeployError

# Float exports must match eager outputs to this (max absolute difference): float32 kernels
# of ONNX Runtime and torch sum in different orders, a few 1e-6 on these models.
FLOAT_TOLERANCE = 1e-4


def batch_dimensions(graph: InferenceGraph, dynamic: bool) -> tuple[Any, ...] | None:
    """torch.export's `dynamic_shapes` for `graph.forward(*tensors)`: the one varargs
    parameter, a tuple with dimension 0 of every tensor the batch."""
    if not dynamic:
        return None
    return batch_dimensions_of(len(graph.input_names))


def batch_dimensions_of(count: int) -> tuple[Any, ...]:
    """`dynamic_shapes` for a forward(*tensors) of `count` tensors sharing the batch."""
    batch = torch.export.Dim("batch", min=1, max=65536)
    return (tuple({0: batch} for _ in range(count)),)


def exporter_reason(error: BaseException) -> str:
    """The line of an exporter's long message that says what failed."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if "## Exception summary" in lines:
        following = lines[lines.index("## Exception summary") + 1 :]
        if following:
            return following[0][:400]
    return lines[0][:400] if lines else type(error).__name__


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The exporter prints its progress ('[torch.onnx] Obtain model graph ...') to stdout, and
    onnxscript's version converter logs its traceback when it cannot convert down to an opset
    (the opset written is checked after, and refused with a message of ours)."""
    converter = logging.getLogger("onnxscript.version_converter")
    level = converter.level
    converter.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        converter.setLevel(level)


def export_onnx(
    graph: InferenceGraph,
    example: Sequence[torch.Tensor],
    path: Path,
    opset: int | None,
    dynamic: bool,
) -> int:
    """Export `graph` to `path`; the opset the file holds (the one asked, or refused)."""
    try:
        with _quiet(), warnings.catch_warnings():
            # Several inputs share the batch dimension: the exporter notes that it names the
            # axis once. Nothing is wrong; that note, and only it, is accepted.
            warnings.filterwarnings(
                "ignore", message=r"# The axis name: .* will not be used", category=UserWarning
            )
            program = torch.onnx.export(
                graph,
                tuple(example),
                dynamo=True,
                input_names=list(graph.input_names),
                output_names=list(graph.output_names),
                opset_version=opset,
                dynamic_shapes=batch_dimensions(graph, dynamic),
                external_data=False,
            )
    except Exception as error:  # the exporter's own message names the operator
        culprit = failing_component(graph, example, dynamic)
        raise DeployError.at(
            "",
            culprit[0].label if culprit else "ONNX export",
            f"torch.onnx.export failed: {exporter_reason(error)}"
            + (f"; this component alone cannot be traced either: {culprit[1]}" if culprit else ""),
            "run with --debug for the exporter's traceback; --outputs can export the "
            "part of the pipeline before the failing component",
        ) from error
    if program is None:
        raise DeployError.at("", "ONNX export", "the exporter returned no program")
    program.save(str(path), external_data=False)
    written = written_opset(path)
    if opset is not None and written != opset:
        # The exporter writes the opsets it supports and converts down only so far: a model
        # of another opset than asked would be recorded as the one asked.
        raise DeployError.at(
            "command line",
            f"--opset {opset}",
            f"the exporter wrote opset {written}, not {opset} (it converts down only so far)",
            "leave out --opset (the exporter's default), or ask for an opset it writes",
        )
    return written


def check_opset(opset: int | None) -> None:
    """An --opset that names no ONNX opset, refused before anything is exported."""
    if opset is None:
        return  # onnx is the deploy extra's: safetensors and pt2 exports do without it
    import onnx

    newest = onnx.defs.onnx_opset_version()
    if not 1 <= opset <= newest:
        raise DeployError.at(
            "command line", f"--opset {opset}", f"is not an ONNX opset (1 to {newest} here)"
        )


def written_opset(path: Path) -> int:
    """The default-domain opset an ONNX file declares."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    versions = [entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")]
    return int(versions[0]) if versions else 0


class _Alone(torch.nn.Module):
    """One component as a module of positional tensors, for torch.export."""

    def __init__(self, component: Component, keys: list[str]) -> None:
        super().__init__()
        self.component, self.keys = component, keys

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.component(dict(zip(self.keys, tensors, strict=True))).values())


def failing_component(
    graph: InferenceGraph, example: Sequence[torch.Tensor], dynamic: bool
) -> tuple[Component, str] | None:
    """The first component of `graph` that torch.export cannot trace on its own (on the
    streams the components before it make of `example`), with the reason: the exporter's
    message names an operator deep inside torch, a user needs the component."""
    batch = dict(zip(graph.input_names, example, strict=True))
    for component, inputs, outputs in graph._routes:
        keys, tensors = [k for k, _ in inputs], tuple(batch[n] for _, n in inputs)
        shapes = batch_dimensions_of(len(tensors)) if dynamic else None
        try:
            with _quiet(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.export.export(_Alone(component, keys), tensors, dynamic_shapes=shapes)
        except Exception as error:  # whatever stops the tracer is the reason
            return component, exporter_reason(error)
        with torch.no_grad():
            for key, value in component(dict(zip(keys, tensors, strict=True))).items():
                batch[outputs[key]] = value
    return None


def onnx_session(path: Path, threads: int | None = None) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = threads
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _feed(graph: InferenceGraph, inputs: Sequence[torch.Tensor]) -> dict[str, np.ndarray]:
    return {
        name: t.detach().cpu().numpy() for name, t in zip(graph.input_names, inputs, strict=True)
    }


def max_difference(
    graph: InferenceGraph, session: Any, batches: Sequence[Sequence[torch.Tensor]]
) -> float:
    """The largest |ONNX Runtime - eager| over every output of every batch (`math.inf` when
    any is not finite)."""
    worst = 0.0
    with torch.no_grad():
        for inputs in batches:
            expected = graph(*inputs)
            produced = session.run(list(graph.output_names), _feed(graph, inputs))
            for want, got in zip(expected, produced, strict=True):
                worst = max(worst, largest_difference(want, got, "ONNX check"))
    return worst


def onnx_call(
    graph: InferenceGraph, session: Any, inputs: Sequence[torch.Tensor]
) -> Callable[[], Any]:
    """One ONNX Runtime run of the graph on `inputs` (converted once, outside the timing)."""
    feed = _feed(graph, inputs)
    names = list(graph.output_names)
    return lambda: session.run(names, feed)


def quantize_onnx(
    float_path: Path,
    int8_path: Path,
    graph: InferenceGraph,
    calibration: Sequence[Sequence[torch.Tensor]],
    per_channel: bool = True,
) -> None:
    """ONNX Runtime's static int8 quantization (QDQ format) of an exported float model,
    calibrated on `calibration` batches (MinMax). The pre-processing step (shape inference,
    graph optimisation) that ONNX Runtime recommends runs first."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        quant_pre_process,
        quantize_static,
    )

    feeds = [_feed(graph, inputs) for inputs in calibration]

    class Batches(CalibrationDataReader):
        def __init__(self) -> None:
            self.remaining = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.remaining, None)

    prepared = int8_path.with_name("preprocessed.onnx")
    try:
        quant_pre_process(str(float_path), str(prepared))
        quantize_static(
            str(prepared),
            str(int8_path),
            Batches(),
            quant_format=QuantFormat.QDQ,
            per_channel=per_channel,
        )
    except Exception as error:
        raise DeployError.at(
            "", "int8 ONNX", f"ONNX Runtime's quantization failed: {error}"
        ) from error
    finally:
        prepared.unlink(missing_ok=True)


def agreement(
    graph: InferenceGraph, session: Any, batches: Sequence[Sequence[torch.Tensor]]
) -> float:
    """The share of samples whose first output's arg-max is the same in ONNX Runtime as in
    torch (an int8 model's top-1 agreement with the float one)."""
    same = total = 0
    with torch.no_grad():
        for inputs in batches:
            expected = graph(*inputs)[0].argmax(dim=-1).numpy()
            (produced,) = session.run([graph.output_names[0]], _feed(graph, inputs))
            same += int((np.asarray(produced).argmax(axis=-1) == expected).sum())
            total += int(expected.size)
    return same / max(total, 1)
