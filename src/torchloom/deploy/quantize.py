"""The quantize worker (`loom quantize RUN_DIR --mode dynamic|static|qat`): a trained run's model
components turned int8 through the route `choose_quantizer` picks, measured against the float
pipeline side by side (weights' size, latency at batch 1 and 32 on one thread, every statistic
on validation and test, per-layer sensitivity), written to `RUN_DIR/quantized/<mode>/`:

    model.pt                   {"format": "torchloom-quantized", "options", "components",
                               "sha256"}: state dicts only, loaded with
                               torch.load(weights_only=True) by `load_quantized` (which
                               rebuilds the modules from config.yaml), its content checked
                               against the SHA-256 digest (engine/checkpoint.py's)
    config.yaml                the run's config
    quantization_report.json   the figures; quantization_report.md the same as tables

Every check (mode, backend, --skip names, checkpoint, an earlier result) happens before
anything is written; the folder appears whole or not at all (output_folder.py).
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from torchloom.core.component import Model
from torchloom.core.pipeline import Pipeline
from torchloom.data.atomic_files import atomic_file, write_text_atomic
from torchloom.deploy.eager_dynamic import savable_state
from torchloom.deploy.graph import InferenceGraph, graph_batch, model_graph, replaced
from torchloom.deploy.measure import (
    check_repeats,
    machine,
    paired_latency_ms,
    ratio,
    serialized_bytes,
    timed_batch,
)
from torchloom.deploy.output_folder import refuse_existing, staged_folder
from torchloom.deploy.qat import fine_tune, fine_tuning_record, resumable, start_record
from torchloom.deploy.quantized_folder import FORMAT
from torchloom.deploy.quantized_folder import is_quantized_folder as is_quantized_folder
from torchloom.deploy.quantized_folder import load_quantized as load_quantized
from torchloom.deploy.quantized_folder import quantized_backend as quantized_backend
from torchloom.deploy.quantizer import (
    Plan,
    QuantizeOptions,
    accepted_deprecations,
    check_skip,
    choose_quantizer,
    quantized_engine,
    weighted_layers,
)
from torchloom.deploy.report import quantization_markdown, write_json
from torchloom.deploy.run_model import TrainedRun, load_trained_run
from torchloom.engine.checkpoint import DIGEST_KEY, content_digest
from torchloom.engine.evaluation import evaluate, statistics_copy
from torchloom.engine.loaders import SectionLoader
from torchloom.engine.processor import section_config
from torchloom.engine.state import evaluated_epoch
from torchloom.engine.step import Precision, WeightedLoss
from torchloom.errors import DeployError

LATENCY_BATCHES = (1, 32)
SENSITIVITY_LIMIT = 40  # layers; beyond, the report says it was not measured
SENSITIVITY_SAMPLES = 256


@dataclass
class QuantizeResult:
    folder: Path
    report: dict[str, Any]


def quantize(
    run_dir: str | Path,
    mode: str = "static",
    *,
    backend: str = "x86",
    calibration_batches: int | None = None,
    per_channel: bool = True,
    skip: Sequence[str] = (),
    checkpoint: str | None = None,
    force: bool = False,
    repeats: int = 30,
    max_eval_batches: int | None = None,
    sensitivity: bool = True,
    qat_epochs: int | None = None,
    qat_lr: float | None = None,
    resume: bool | str | Path = False,
) -> QuantizeResult:
    """Quantize a run folder's model components; see the module docstring. `resume` (qat
    only): continue the latest fine-tuning run of the run folder stopped before its end (or
    the one at that path) instead of starting one; see qat.py."""
    options = QuantizeOptions(mode, backend, per_channel, tuple(skip))
    quantizer = choose_quantizer(options)  # a wrong mode or backend, before anything is read
    # Options of another mode were taken without a word (--mode dynamic --qat-epochs 5).
    for option, value, used_by in (
        ("--calibration-batches", calibration_batches, "static"),
        ("--qat-epochs", qat_epochs, "qat"),
        ("--qat-lr", qat_lr, "qat"),
    ):
        if value is not None and mode != used_by:
            raise DeployError.at(
                "command line",
                option,
                f"applies to --mode {used_by}; --mode {mode} would not use it",
                f"leave it out, or use --mode {used_by}",
            )
    if qat_lr is not None and not (math.isfinite(qat_lr) and qat_lr > 0):
        # Was reported as training.optimizer.lr, a key the user never wrote.
        raise DeployError.at("command line", "--qat-lr", f"must be a rate above 0, got {qat_lr}")
    calibration_batches = 16 if calibration_batches is None else calibration_batches
    qat_epochs = 1 if qat_epochs is None else qat_epochs
    if qat_epochs < 1:
        raise DeployError.at("command line", "--qat-epochs", "must be at least 1")
    if calibration_batches < 1:
        raise DeployError.at("command line", "--calibration-batches", "must be at least 1")
    check_repeats(repeats)
    if resume and mode != "qat":
        raise DeployError.at(
            "command line",
            "--resume",
            f"continues a quantization-aware fine-tuning run; --mode {mode} trains nothing",
            "use it with --mode qat",
        )
    run = load_trained_run(run_dir, checkpoint)
    target = run.run_dir / "quantized" / mode
    refuse_existing(target, force, "loom quantize", resuming=bool(resume))
    resume_from = (
        resumable(run, start_record(run, quantizer, qat_epochs, qat_lr), resume) if resume else None
    )
    pipeline = run.pipeline
    models = pipeline.models
    check_skip(options, models)
    section = _measured_section(pipeline)
    graph = model_graph(pipeline, section)
    samples = graph.example_inputs(graph_batch(pipeline, section, graph, SENSITIVITY_SAMPLES))
    with quantized_engine(backend), accepted_deprecations():
        before = _measure(run, max_eval_batches)
        float_models = {m.name: copy.deepcopy(m) for m in models}
        plan = Plan()
        for model in models:
            quantizer.prepare(model, plan)
        training_run, tuned = None, None
        if mode == "qat":
            training_run = fine_tune(run, quantizer, qat_epochs, qat_lr, resume_from)
            tuned = _measure_in_float(run, max_eval_batches)
        calibration, calibrated = _calibrate(
            run, graph, calibration_batches, observe=mode == "static"
        )
        for model in models:
            quantizer.convert(model)
        _check_runs(graph, samples, plan)
        after = _measure(run, max_eval_batches)
        latency = _latency(graph, float_models, samples, repeats)
        layers = (
            _sensitivity(graph, float_models, options, plan, calibration, samples)
            if sensitivity
            else {}
        )
    report = {
        "run_dir": str(run.run_dir),
        "checkpoint": str(run.checkpoint),
        "checkpoint_progress": run.progress,  # its epoch and episode: best.pt moves on
        "mode": mode,
        "route": quantizer.route,
        "options": options.record(),
        "calibration_batches": calibrated[1] if mode == "static" else 0,  # as many as ran
        "calibration_section": calibrated[0] if mode == "static" else None,
        "qat": None if training_run is None else fine_tuning_record(training_run, qat_epochs),
        "machine": machine(),
        "torch": torch.__version__,
        "threads": 1,
        "latency_repeats": repeats,
        "latency_section": section,
        "graph": graph.describe(),
        "size_bytes": {"float": before["size"], "int8": after["size"]},
        "size_ratio": round(after["size"] / before["size"], 3),
        "latency_ms": {
            str(b): {
                "float": latency[b]["float"],
                "int8": latency[b]["int8"],
                "speedup": ratio(latency[b]["float"], latency[b]["int8"]),
            }
            for b in LATENCY_BATCHES
        },
        "statistics": {
            s: {
                "float": before["statistics"][s],
                **({} if tuned is None else {"float_fine_tuned": tuned["statistics"][s]}),
                "int8": after["statistics"][s],
            }
            for s in before["statistics"]
        },
        "layers": [{**vars(layer), "sqnr_db": layers.get(layer.name)} for layer in plan.layers],
    }
    # `loom process` of the folder writes into process/: earlier results outlive --force.
    with staged_folder(target, force, "loom quantize", keep=("process",)) as folder:
        payload: dict[str, Any] = {
            "format": FORMAT,
            "options": options.record(),
            "components": {n: savable_state(c) for n, c in pipeline.components.items()},
        }
        payload[DIGEST_KEY] = content_digest(payload)
        with atomic_file(folder / "model.pt", durable=True) as out:
            torch.save(payload, out)
        write_text_atomic(
            folder / "config.yaml", (run.run_dir / "config.yaml").read_text(encoding="utf-8")
        )
        write_json(folder / "quantization_report.json", report)
        write_text_atomic(folder / "quantization_report.md", quantization_markdown(report))
    return QuantizeResult(target, report)


def _check_runs(graph: InferenceGraph, samples: tuple[torch.Tensor, ...], plan: Plan) -> None:
    """The converted graph runs on a batch. A model whose forward reads a layer's weights
    itself (`F.linear(x, self.fc.weight)`) or does arithmetic eager quantization cannot see
    fails here: a plain error naming the quantized layers, not a traceback mid-evaluation."""
    try:
        with torch.no_grad():
            graph(*tuple(t[:2] for t in samples))
    except Exception as error:
        layers = ", ".join(layer.name for layer in plan.quantized[:8])
        raise DeployError.at(
            "",
            "int8 pipeline",
            f"fails on a batch after conversion: {type(error).__name__}: "
            f"{str(error).splitlines()[0][:300]}",
            f"a model uses a quantized layer in a way eager quantization cannot "
            f"follow; keep it in float with --skip (quantized: {layers}), or try "
            "another --mode",
        ) from error


def _measured_section(pipeline: Pipeline) -> str:
    for section in ("test", "validation", "training"):
        if section in pipeline.tasks:
            return section
    raise DeployError.at("", "pipeline", "has no section with a task to measure on")


def _batches(run: TrainedRun, section: str) -> Iterable[Any]:
    """The section's batches as the run's own evaluation at the checkpoint visited them: its
    seed, its epoch (a k-fold run's held-out fold of that epoch, not fold 0)."""
    settings = section_config(run.config.data, section, run.config.where)
    seed = int((run.config.data.get("training") or {}).get("seed") or 0)
    loader = SectionLoader(section, run.pipeline.tasks[section], settings, seed, run.config.where)
    return loader.epoch(evaluated_epoch(run.progress))


def _measure_in_float(run: TrainedRun, max_batches: int | None) -> dict[str, Any]:
    """The fine-tuned weights measured in float (fake quantization off): the int8 model is
    these weights quantized, so the cost of quantization is int8 against them, not against
    the run's checkpoint, which trained for fewer epochs."""
    from torch.ao.quantization import disable_fake_quant, enable_fake_quant

    for model in run.pipeline.models:
        model.apply(disable_fake_quant)
    try:
        return _measure(run, max_batches)
    finally:
        for model in run.pipeline.models:
            model.apply(enable_fake_quant)


def _measure(run: TrainedRun, max_batches: int | None) -> dict[str, Any]:
    pipeline = run.pipeline
    training = run.config.data.get("training") or {}
    loss = (
        WeightedLoss(pipeline, training.get("loss_weights") or {}, run.config.where)
        if pipeline.losses
        else None
    )
    cpu = torch.device("cpu")
    values = {}
    for section in ("validation", "test"):
        if section not in pipeline.tasks:
            continue
        values[section] = evaluate(
            pipeline,
            _batches(run, section),
            statistics_copy(pipeline, cpu),
            loss,
            Precision("fp32", cpu),
            cpu,
            max_batches=max_batches,
        )
    weights = {m.name: savable_state(m) for m in pipeline.models}
    return {"statistics": values, "size": serialized_bytes(weights)}


def _latency(
    graph: InferenceGraph,
    float_models: dict[str, Model],
    samples: tuple[torch.Tensor, ...],
    repeats: int,
) -> dict[int, dict[str, float]]:
    """Float and int8 graphs timed in turns (measure.paired_latency_ms), per batch size, each
    size on fresh copies of both, first called at that size: torch's oneDNN int8
    convolutions (the x86 engine's) keep a cached primitive for the input shape of their
    first call only, and take a slower path for any other (LeNet-5 int8 at batch 32: 0.82 ms
    first called at 32, 0.92-1.0 ms after a first call at 1 or 256; float's time is the
    same either way). A deployment serving one batch size gets the fast path; so does each
    figure."""
    found = {}
    for size in LATENCY_BATCHES:
        # deepcopy packs a quantized layer's weights again: no shape cached yet.
        int8_graph = replaced(
            graph, {c.name: copy.deepcopy(c) for c in graph.chosen if c.name in float_models}
        )
        float_graph = replaced(graph, {n: copy.deepcopy(m) for n, m in float_models.items()})
        inputs = timed_batch(samples, size)
        medians = paired_latency_ms(
            {
                "float": functools.partial(float_graph, *inputs),
                "int8": functools.partial(int8_graph, *inputs),
            },
            repeats,
        )
        found[size] = {name: round(value, 4) for name, value in medians.items()}
    return found


def _calibrate(
    run: TrainedRun, graph: InferenceGraph, batches: int, observe: bool
) -> tuple[list[tuple[torch.Tensor, ...]], tuple[str, int]]:
    """With `observe`, run `batches` training batches (else the measured section's) through
    the prepared pipeline; returns the graph inputs of the first few, for the sensitivity
    trials, and (the section, the batches observed: fewer when it has fewer)."""
    pipeline = run.pipeline
    section = "training" if "training" in pipeline.tasks else _measured_section(pipeline)
    kept, ran = [], 0
    with torch.no_grad():
        for index, batch in enumerate(_batches(run, section)):
            if index >= (batches if observe else 4):
                break
            if observe or any(name not in batch for name in graph.input_names):
                pipeline(batch)
            ran += 1
            if index < 4:
                kept.append(graph.example_inputs(batch))
    return kept, (section, ran)


def _sqnr_db(reference: torch.Tensor, other: torch.Tensor) -> float:
    noise = float((reference - other).pow(2).sum())
    signal = float(reference.pow(2).sum())
    return round(10 * math.log10(signal / noise), 2) if noise > 0 else math.inf


def _sensitivity(
    graph: InferenceGraph,
    float_models: dict[str, Model],
    options: QuantizeOptions,
    plan: Plan,
    calibration: list[tuple[torch.Tensor, ...]],
    samples: tuple[torch.Tensor, ...],
) -> dict[str, float]:
    """SQNR (dB) of the graph's first output with only one layer quantized, per quantized
    layer: the lower, the more that layer alone costs (a candidate for --skip). QAT layers
    are tried as post-training static ones (what they cost before fine-tuning). A layer of
    a model outside the graph (a multitask pipeline's other heads) is not measured: the
    graph's output would not change (an SQNR of inf, read as harmless)."""
    if options.mode == "qat":
        options = replace(options, mode="static")
    reference_graph = replaced(graph, {n: copy.deepcopy(m) for n, m in float_models.items()})
    with torch.no_grad():
        reference = reference_graph(*samples)[0].float()
    every = weighted_layers(list(float_models.values()))
    found: dict[str, float] = {}
    in_graph = {component.name for component in graph.components}
    measured = [layer for layer in plan.quantized if layer.name.split(".")[0] in in_graph]
    for layer in measured[:SENSITIVITY_LIMIT]:
        alone = replace(options, skip=tuple(n for n in every if n != layer.name))
        trial = choose_quantizer(alone)
        copies = {n: copy.deepcopy(m) for n, m in float_models.items()}
        for model in copies.values():
            trial.prepare(model, Plan())
        trial_graph = replaced(graph, dict(copies))
        with torch.no_grad():
            for inputs in calibration if trial.needs_calibration else []:
                trial_graph(*inputs)
        for model in copies.values():
            trial.convert(model)
        with torch.no_grad():
            found[layer.name] = _sqnr_db(reference, trial_graph(*samples)[0].float())
    return found
