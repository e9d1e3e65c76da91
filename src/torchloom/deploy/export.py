"""The export worker (`loom export RUN_DIR --format onnx|pt2|safetensors`): the tensor part of a
trained pipeline (the task's tensor inputs to the chosen output streams, `graph.py`) written
to `RUN_DIR/exports/<format>/`, checked, and described:

    onnx:        model.onnx, checked in ONNX Runtime against eager outputs on real test
                 batches (max abs difference <= 1e-4, else an error), and timed in both
    pt2:         model.pt2 (`torch.export.save`), reloaded and checked against eager; with
                 --aoti also model_aoti.pt2, an AOTInductor package (compiled with the
                 machine's C++ compiler), checked and timed against eager
    safetensors: model.safetensors, every component's weights (`safetensors.torch.save_model`,
                 which handles tied weights), reread and checked
    sidecar.json         pre- and post-processing a deployment needs (sidecar.py)
    export_report.md/.json

Every check (format, outputs, components the graph cannot hold, checkpoint, an earlier
export) happens before anything is written; the folder appears whole or not at all.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchloom.data.atomic_files import write_text_atomic
from torchloom.deploy.aoti import aoti_package
from torchloom.deploy.graph import InferenceGraph, graph_batch, upstream_components
from torchloom.deploy.measure import (
    check_repeats,
    largest_difference,
    machine,
    paired_latency_ms,
    ratio,
    timed_batch,
)
from torchloom.deploy.onnx_export import (
    FLOAT_TOLERANCE,
    agreement,
    batch_dimensions,
    check_opset,
    export_onnx,
    exporter_reason,
    max_difference,
    onnx_call,
    onnx_session,
    quantize_onnx,
)
from torchloom.deploy.output_folder import refuse_existing, staged_folder
from torchloom.deploy.report import export_markdown, write_json
from torchloom.deploy.run_model import load_trained_run
from torchloom.deploy.sidecar import sidecar
from torchloom.deploy.tensor_files import tensors_of, write_tensors
from torchloom.deploy.upstream_weights import carry_trained_weights
from torchloom.errors import DeployError, did_you_mean

FORMATS = ("onnx", "pt2", "safetensors")
CHECK_BATCHES = 4
CALIBRATION_SAMPLES = 256
BATCH = 32


@dataclass
class ExportResult:
    folder: Path
    report: dict[str, Any]


def export(
    run_dir: str | Path,
    format: str = "onnx",
    *,
    outputs: Sequence[str] = (),
    inputs: Sequence[str] = (),
    opset: int | None = None,
    dynamic_batch: bool = True,
    checkpoint: str | None = None,
    force: bool = False,
    repeats: int = 30,
    int8: bool = False,
    aoti: bool = False,
) -> ExportResult:
    """Export a run folder's tensor graph; see the module docstring."""
    if format not in FORMATS:
        raise DeployError.at(
            "command line",
            f"--format {format}",
            "is not an export format",
            did_you_mean(format, FORMATS) or f"formats: {', '.join(FORMATS)}",
        )
    if int8 and format != "onnx":
        raise DeployError.at(
            "command line",
            "--int8",
            f"applies to --format onnx only, not {format}",
            "`loom quantize` makes int8 torch models",
        )
    if opset is not None and format != "onnx":  # taken without a word
        raise DeployError.at(
            "command line", "--opset", f"applies to --format onnx only, not {format}"
        )
    if aoti and format != "pt2":
        raise DeployError.at(
            "command line", "--aoti", f"applies to --format pt2 only, not {format}"
        )
    if int8 and not dynamic_batch:
        raise DeployError.at(
            "command line",
            "--int8",
            "calibrates and is timed on batches of 32, which a model exported for batches of "
            "1 (--static-batch) cannot take",
            "export without --static-batch",
        )
    check_repeats(repeats)
    check_opset(opset)
    run = load_trained_run(run_dir, checkpoint)
    target = run.run_dir / "exports" / format
    refuse_existing(target, force, "loom export")
    pipeline = run.pipeline
    section = next((s for s in ("test", "validation", "training") if s in pipeline.tasks), None)
    if section is None:
        raise DeployError.at("", "pipeline", "has no section with a task")
    graph = InferenceGraph(pipeline, section, list(outputs) or None, list(inputs) or None).eval()
    full = graph.example_inputs(graph_batch(pipeline, section, graph, BATCH * CHECK_BATCHES))
    batches = [
        tuple(t[i : i + BATCH] for t in full)
        for i in range(0, int(full[0].shape[0]) if full else 0, BATCH)
    ]
    # A batch of 2 for tracing: torch.export specialises a dimension of size 1.
    example = (
        tuple(t[:2] for t in batches[0]) if dynamic_batch else tuple(t[:1] for t in batches[0])
    )
    if not dynamic_batch:
        batches = [tuple(t[i : i + 1] for t in full) for i in range(min(8, int(full[0].shape[0])))]
    report: dict[str, Any] = {
        "run_dir": str(run.run_dir),
        "checkpoint": str(run.checkpoint),
        "checkpoint_progress": run.progress,  # its epoch and episode: best.pt moves on
        "format": format,
        "graph": graph.describe(),
        "dynamic_batch": dynamic_batch,
        "machine": machine(),
        "torch": torch.__version__,
        "threads": 1,
        "latency_repeats": repeats,
    }
    with staged_folder(target, force, "loom export") as folder:
        if format == "onnx":
            report.update(_onnx(graph, example, batches, folder, opset, dynamic_batch, repeats))
            report["check"]["section"] = section  # the split its batches came from
            if int8:
                calibrated, calibration = _calibration_batches(pipeline, graph)
                report["int8"] = _onnx_int8(graph, batches, calibration, folder, repeats)
                report["int8"]["calibration_section"] = calibrated
        elif format == "pt2":
            report.update(_pt2(graph, example, batches, folder, dynamic_batch, aoti, repeats))
            report["check"]["section"] = section
        else:
            report.update(_safetensors(pipeline.components, folder))
        record = sidecar(pipeline, section, graph)
        upstream = upstream_components(pipeline, section, graph)
        for component in upstream:
            for name, text in component.artifacts().items():
                write_text_atomic(folder / "artifacts" / component.name / name, text)
        carried = carry_trained_weights(folder, record, upstream)
        if carried:
            report["weights_before_graph"] = carried
        write_json(folder / "sidecar.json", record)
        write_json(folder / "export_report.json", report)
        write_text_atomic(folder / "export_report.md", export_markdown(report))
    return ExportResult(target, report)


def _onnx(
    graph: InferenceGraph,
    example: tuple[torch.Tensor, ...],
    batches: list[tuple[torch.Tensor, ...]],
    folder: Path,
    opset: int | None,
    dynamic: bool,
    repeats: int,
) -> dict[str, Any]:
    path = folder / "model.onnx"
    opset = export_onnx(graph, example, path, opset, dynamic)  # as written, not as asked
    session = onnx_session(path, threads=1)
    difference = max_difference(graph, session, batches)
    if not difference <= FLOAT_TOLERANCE:
        raise DeployError.at(
            "",
            "ONNX check",
            f"ONNX Runtime's outputs differ from torch's by up to {difference:.3g} "
            f"(tolerance {FLOAT_TOLERANCE:g}): the export would give other results",
            "report it with the config; --outputs can narrow down the component",
        )
    latency = {}
    sizes = (1, BATCH) if dynamic else (1,)
    for size in sizes:
        inputs = timed_batch(batches[0], size)
        medians = paired_latency_ms(
            {
                "eager": functools.partial(graph, *inputs),
                "onnxruntime": onnx_call(graph, session, inputs),
            },
            repeats,
        )
        eager, runtime = medians["eager"], medians["onnxruntime"]
        latency[str(size)] = {
            "torch_eager": round(eager, 4),
            "onnxruntime": round(runtime, 4),
            "speedup": ratio(eager, runtime),
        }
    return {
        "file": path.name,
        "bytes": path.stat().st_size,
        "opset": opset,
        "check": {
            "max_abs_difference": difference,
            "tolerance": FLOAT_TOLERANCE,
            "batches": len(batches),
            "samples": sum(int(b[0].shape[0]) for b in batches),
        },
        "latency_ms": latency,
    }


def _pt2(
    graph: InferenceGraph,
    example: tuple[torch.Tensor, ...],
    batches: list[tuple[torch.Tensor, ...]],
    folder: Path,
    dynamic: bool,
    aoti: bool,
    repeats: int,
) -> dict[str, Any]:
    path = folder / "model.pt2"
    try:
        program = torch.export.export(
            graph, example, dynamic_shapes=batch_dimensions(graph, dynamic)
        )
    except Exception as error:
        raise DeployError.at(
            "",
            "torch.export",
            f"failed: {exporter_reason(error)}",
            "run with --debug for the traceback",
        ) from error
    torch.export.save(program, str(path))
    reloaded = torch.export.load(str(path)).module()
    worst = 0.0
    with torch.no_grad():
        for inputs in batches:
            for want, got in zip(graph(*inputs), reloaded(*inputs), strict=True):
                worst = max(worst, largest_difference(want, got, "torch.export check"))
    if not worst <= FLOAT_TOLERANCE:
        raise DeployError.at(
            "",
            "torch.export check",
            f"the reloaded program's outputs differ from eager torch's by up to {worst:.3g} "
            f"(tolerance {FLOAT_TOLERANCE:g}): the export would give other results",
            "report it with the config; --outputs can narrow down the component",
        )
    found = {
        "file": path.name,
        "bytes": path.stat().st_size,
        "check": {
            "max_abs_difference": worst,
            "tolerance": FLOAT_TOLERANCE,
            "batches": len(batches),
        },
        "load": "torch.export.load(path).module()(*inputs)",
    }
    if aoti:
        sizes = (1, BATCH) if dynamic else (1,)
        package = folder / "model_aoti.pt2"
        found["aoti"] = aoti_package(program, graph, batches, package, repeats, sizes)
    return found


def _safetensors(components: Mapping[str, nn.Module], folder: Path) -> dict[str, Any]:
    path = folder / "model.safetensors"
    states = {name: component.state_dict() for name, component in components.items()}
    # A component's extra state (an indexer's vocabulary) is no tensor: safetensors holds
    # tensors alone, and the component rebuilds it from the run's config.
    not_tensors = sorted(n for n, s in states.items() if len(tensors_of(s)) < len(s))
    tensors = {
        k: v for name, state in states.items() for k, v in tensors_of(state, f"{name}.").items()
    }
    saved, copies = write_tensors(tensors, path)
    # safetensors' load_model reads the module's whole state, extra state included, which it
    # cannot, and counts a view stored as a copy as unexpected: such a pipeline loads the
    # file's tensors through torch (the rest left as built).
    load = (
        "pipeline.registered.load_state_dict(safetensors.torch.load_file(path), strict=False)"
        if not_tensors or copies
        else "safetensors.torch.load_model(pipeline.registered, path)"
    )
    found: dict[str, Any] = {
        "file": path.name,
        "bytes": path.stat().st_size,
        "tensors": len(saved),
        "load": f"{load} (keys: <component>.<weight>)",
    }
    if not_tensors:
        found["not_in_file"] = {
            name: "its extra state (not tensors), rebuilt from the run's config"
            for name in not_tensors
        }
    return found


def _calibration_batches(
    pipeline: Any, graph: InferenceGraph
) -> tuple[str, list[tuple[torch.Tensor, ...]]]:
    """The section and the graph inputs of its first CALIBRATION_SAMPLES samples, in batches
    of BATCH: the training set's, else the first section's (the report says which)."""
    section = "training" if "training" in pipeline.tasks else next(iter(pipeline.tasks))
    full = graph.example_inputs(graph_batch(pipeline, section, graph, CALIBRATION_SAMPLES))
    steps = range(0, int(full[0].shape[0]), BATCH)
    return section, [tuple(t[i : i + BATCH] for t in full) for i in steps]


def _onnx_int8(
    graph: InferenceGraph,
    batches: list[tuple[torch.Tensor, ...]],
    calibration: list[tuple[torch.Tensor, ...]],
    folder: Path,
    repeats: int,
) -> dict[str, Any]:
    """model_int8.onnx (ONNX Runtime static QDQ), measured against model.onnx."""
    path = folder / "model_int8.onnx"
    quantize_onnx(folder / "model.onnx", path, graph, calibration)
    float_session = onnx_session(folder / "model.onnx", threads=1)
    session = onnx_session(path, threads=1)
    latency = {}
    for size in (1, BATCH):
        inputs = timed_batch(batches[0], size)
        medians = paired_latency_ms(
            {
                "float": onnx_call(graph, float_session, inputs),
                "int8": onnx_call(graph, session, inputs),
            },
            repeats,
        )
        latency[str(size)] = {
            "float": round(medians["float"], 4),
            "int8": round(medians["int8"], 4),
            "speedup": ratio(medians["float"], medians["int8"]),
        }
    return {
        "file": path.name,
        "bytes": path.stat().st_size,
        "float_bytes": (folder / "model.onnx").stat().st_size,
        "calibration_samples": sum(int(b[0].shape[0]) for b in calibration),
        "top1_agreement_with_float": round(agreement(graph, session, batches), 4),
        "max_abs_difference_to_torch": max_difference(graph, session, batches),
        "latency_ms": latency,
    }
