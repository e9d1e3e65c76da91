"""The reports `loom quantize` and `loom export` write next to their results: JSON for tools,
Markdown for people (the same figures)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from torchloom.data.atomic_files import write_text_atomic


def graph_text(graph: dict[str, Any]) -> str:
    """The graph a report timed: its inputs, outputs and components."""
    return (
        f"{', '.join(graph['inputs'])} -> {', '.join(graph['outputs'])} through "
        f"{', '.join(graph['components'])}"
    )


def fine_tuned_text(record: dict[str, Any]) -> str:
    """'N epoch(s)', with how it ended when that was before the epochs asked."""
    text = f"{record['epochs']} epoch(s)"
    if record["epochs"] != record["epochs_asked"]:
        text += f" of {record['epochs_asked']} asked ({record['status']})"
    return text


def write_json(path: Path, record: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(record, indent=2, default=_plain) + "\n")


def _plain(value: Any) -> Any:
    return str(value)


def _number(value: Any) -> str:
    if isinstance(value, float):
        if math.isinf(value):
            return "inf"
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def _speedups(
    latency_ms: dict[Any, dict[str, Any]], baseline: tuple[str, str], candidate: tuple[str, str]
) -> list[str]:
    """A latency table per batch size: (column title, report key) of the baseline and the
    candidate, and the speedup the report recorded."""
    rows = [
        [batch, e[baseline[1]], e[candidate[1]], f"{e['speedup']:.2f}x"]
        for batch, e in latency_ms.items()
    ]
    return _table(["batch", baseline[0], candidate[0], "speedup"], rows)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_number(v) for v in row) + " |" for row in rows]
    return lines


def quantization_markdown(report: dict[str, Any]) -> str:
    size = report["size_bytes"]
    lines = [
        f"# Quantization report: {report['mode']}",
        "",
        f"- run: `{report['run_dir']}` (checkpoint `{report['checkpoint']}`{_at(report)})",
        f"- route: {report['route']}",
        f"- backend: {report['options']['backend']}, "
        f"{'per-channel' if report['options']['per_channel'] else 'per-tensor'} weights, "
        f"calibration batches: {report['calibration_batches']}"
        + (f" ({report['calibration_section']})" if report.get("calibration_section") else ""),
        f"- measured on: {report['machine']}, torch {report['torch']}, "
        f"{report['threads']} thread, median of {report['latency_repeats']} runs "
        f"(warm-up excluded), inputs from the {report['latency_section']} set",
        f"- timed graph: {graph_text(report['graph'])}",
    ]
    if report.get("qat"):
        lines.append(
            f"- quantization-aware fine-tuning: {fine_tuned_text(report['qat'])}, run folder "
            f"`{report['qat']['training_run']}`"
        )
    lines += [
        "",
        "## Size and latency (float vs int8)",
        "",
    ]
    rows: list[list[Any]] = [
        ["weights (bytes)", size["float"], size["int8"], f"{report['size_ratio']:.3f}x size"]
    ]
    for batch, entry in report["latency_ms"].items():
        rows.append(
            [
                f"latency, batch {batch} (ms)",
                entry["float"],
                entry["int8"],
                f"{entry['speedup']:.2f}x (float/int8 time)",
            ]
        )
    lines += _table(["", "float", "int8", "ratio"], rows)
    for section, values in report["statistics"].items():
        lines += ["", f"## Statistics on {section}", ""]
        before, after = values["float"], values["int8"]
        keys = [k for k in before if k in after]
        tuned = values.get("float_fine_tuned")
        if tuned is None:
            lines += _table(
                ["statistic", "float", "int8", "int8 - float"],
                [[k, before[k], after[k], _difference(before[k], after[k])] for k in keys],
            )
            continue
        # QAT: the int8 model is the fine-tuned weights quantized; the run's checkpoint trained
        # fewer epochs, and the fine-tuning's best.pt was chosen on validation.
        lines += _table(
            ["statistic", "float (run)", "float (fine-tuned)", "int8", "int8 - fine-tuned"],
            [
                [k, before[k], tuned.get(k), after[k], _difference(tuned.get(k), after[k])]
                for k in keys
            ],
        )
        if section == "validation":
            lines += ["", "(the fine-tuning kept its best epoch by validation: see the test set)"]
    lines += ["", "## Layers", ""]
    lines += [
        "SQNR: signal-to-quantization-noise ratio (dB) of the pipeline's output with only that "
        "layer quantized; the lowest are the first to keep in float with `--skip`; `-`: not "
        "measured (a layer of a model outside the timed graph, whose output it does not "
        "change, or past the number of layers measured).",
        "",
    ]
    lines += _table(
        ["layer", "type", "int8", "SQNR (dB)", "why left in float"],
        [
            [
                layer["name"],
                layer["kind"],
                "yes" if layer["quantized"] else "no",
                layer.get("sqnr_db"),
                layer["reason"],
            ]
            for layer in report["layers"]
        ],
    )
    return "\n".join(lines) + "\n"


def _difference(before: Any, after: Any) -> Any:
    if isinstance(before, (int, float)) and isinstance(after, (int, float)):
        return after - before
    return None


def export_markdown(report: dict[str, Any]) -> str:
    graph = report["graph"]
    lines = [
        f"# Export report: {report['format']}",
        "",
        f"- run: `{report['run_dir']}` (checkpoint `{report['checkpoint']}`{_at(report)})",
        f"- file: `{report['file']}` ({report['bytes']:,} bytes)",
        f"- inputs: {', '.join(graph['inputs'])}; outputs: {', '.join(graph['outputs'])}",
        f"- components in the graph: {', '.join(graph['components'])}",
        f"- batch size: {'any' if report['dynamic_batch'] else 'fixed'}",
        f"- measured on: {report['machine']}, torch {report['torch']}, {report['threads']} "
        f"thread, median of {report['latency_repeats']} runs (warm-up excluded)",
    ]
    check = report.get("check")
    if check:
        tolerance = check.get("tolerance")
        lines.append(
            f"- check against eager torch on {check['batches']} real batches"
            + (f" of the {check['section']} split" if "section" in check else "")
            + f": max abs difference {check['max_abs_difference']:.3g}"
            + (f" (tolerance {tolerance:g})" if tolerance is not None else "")
        )
    if "load" in report:
        lines.append(f"- load with: `{report['load']}`")
    for component, why in report.get("not_in_file", {}).items():
        lines.append(f"- not in the file: {component}'s {why.removeprefix('its ')}")
    for component in report.get("weights_before_graph", []):
        lines.append(
            f"- before the graph: {component}'s trained weights, in "
            f"`artifacts/{component}/weights.safetensors` (`loom predict` loads them)"
        )
    if report.get("latency_ms"):
        lines += ["", "## Latency (ms)", ""]
        lines += _speedups(
            report["latency_ms"], ("torch eager", "torch_eager"), ("ONNX Runtime", "onnxruntime")
        )
    aoti = report.get("aoti")
    if aoti:
        lines += [
            "",
            "## AOTInductor package",
            "",
            f"- file: `{aoti['file']}` ({aoti['bytes']:,} bytes); load with `{aoti['load']}`",
            f"- max abs difference to eager torch: {aoti['max_abs_difference']:.3g} "
            f"(tolerance {aoti['tolerance']:g})",
            "",
        ]
        lines += _speedups(
            aoti["latency_ms"], ("torch eager", "torch_eager"), ("AOTInductor", "aoti")
        )
    int8 = report.get("int8")
    if int8:
        lines += [
            "",
            "## int8 ONNX (ONNX Runtime static QDQ quantization)",
            "",
            f"- file: `{int8['file']}` ({int8['bytes']:,} bytes, "
            f"{int8['bytes'] / int8['float_bytes']:.3f}x the float file)",
            f"- calibration: {int8['calibration_samples']} "
            f"{int8.get('calibration_section', 'training')} samples (MinMax)",
            f"- top-1 agreement with torch float on the check batches: "
            f"{int8['top1_agreement_with_float']:.4f}; max abs difference "
            f"{int8['max_abs_difference_to_torch']:.3g}",
            "",
        ]
        lines += _speedups(
            int8["latency_ms"], ("ONNX Runtime float", "float"), ("ONNX Runtime int8", "int8")
        )
    return "\n".join(lines) + "\n"


def _at(report: dict[str, Any]) -> str:
    """Where the checkpoint's weights stood, when the report knows (best.pt moves on)."""
    progress = report.get("checkpoint_progress") or {}
    parts = [f"{k} {progress[k]}" for k in ("epoch", "episode") if k in progress]
    return f", saved at {', '.join(parts)}" if parts else ""
