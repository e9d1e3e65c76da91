"""Model summary at the start of training: `reports/model_summary.md` and a few log lines.

Per component: parameters (trainable / frozen). Per layer (leaf module): the output shape,
measured with forward hooks on one training batch, and its parameters. A memory estimate:
parameters + gradients + optimizer state + the activations of that batch.

The measuring pass observes only: eval mode and no gradients (no BatchNorm statistics move,
no Dropout draws), every module's mode restored afterwards, and the random generators
saved and restored around it — exact resume and bit-identical runs depend on the RNG stream.
The batch is the first samples of the training task in task order, collated as the loader
does, so no loader, sampler or generator advances. Components that publish no stream
(viewers, exporters) are not run: there is nothing to measure and they would act.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from torchloom.analysis.schema import AnalysisConfig
from torchloom.core.component import Batch, Component, Statistic
from torchloom.core.pipeline import Pipeline
from torchloom.data.atomic_files import write_text_atomic
from torchloom.engine.checkpoint import capture_rng_state, restore_rng_state
from torchloom.engine.loaders import SectionLoader, to_device
from torchloom.engine.state import Hook
from torchloom.engine.step import batch_size_of, running_eagerly

if TYPE_CHECKING:
    from torchloom.engine.state import RunView

MB = 1e6


@dataclass
class Layer:
    component: str
    name: str  # within its component; "" for a component without submodules
    kind: str
    shape: str = "not run"
    parameters: int = 0
    output_bytes: int = 0


@dataclass
class Summary:
    components: list[tuple[str, str, int, int]]  # name, type, trainable, frozen
    layers: list[Layer]
    batch_size: int
    memory_mb: dict[str, float] = field(default_factory=dict)
    note: str = ""


def sample_batch(data: SectionLoader) -> Batch:
    """The first `batch_size` samples of the task, collated and renamed as the loader does."""
    count = min(data.config.batch_size, len(data.task))
    return data.collate(data.task.fetch(range(count)))


def describe_output(value: Any) -> tuple[str, int]:
    """(shape text, bytes) of a module's output: tensors, and tuples / dicts of them."""
    if isinstance(value, torch.Tensor):
        return str(list(value.shape)), value.numel() * value.element_size()
    if isinstance(value, dict):
        parts = {key: describe_output(item) for key, item in value.items()}
        text = ", ".join(f"{key}: {shape}" for key, (shape, _) in parts.items())
        return "{" + text + "}", sum(size for _, size in parts.values())
    if isinstance(value, (tuple, list)):
        parts_list = [describe_output(item) for item in value]
        text = ", ".join(shape for shape, _ in parts_list)
        return f"({text})", sum(size for _, size in parts_list)
    return type(value).__name__, 0


def leaf_modules(component: Component) -> Iterator[tuple[str, nn.Module]]:
    """Modules without children; the component itself when it has none (a loss)."""
    leaves = [(n, m) for n, m in component.named_modules() if not any(m.children())]
    return iter(leaves or [("", component)])


@contextmanager
def observing(pipeline: Pipeline) -> Iterator[None]:
    """Eval mode, no gradients, RNG untouched: everything restored on the way out."""
    rng = capture_rng_state()
    modes = {module: module.training for module in pipeline.modules()}
    try:
        pipeline.eval()
        with torch.no_grad():
            yield
    finally:
        for module, mode in modes.items():
            module.training = mode
        restore_rng_state(rng)


def measure(run: RunView) -> Summary:
    pipeline = run.pipeline
    layers: dict[nn.Module, Layer] = {}
    for name, component in pipeline.components.items():
        if isinstance(component, Statistic):
            continue
        for layer_name, module in leaf_modules(component):
            parameters = sum(p.numel() for p in module.parameters())
            layers[module] = Layer(name, layer_name, type(module).__name__, parameters=parameters)
    components = [
        (name, type(c).__name__, *c.parameter_counts()) for name, c in pipeline.components.items()
    ]
    summary = Summary(components, list(layers.values()), 0)
    if run.sharded_models:
        # Each process holds a shard: a forward on rank 0 alone would wait for the others.
        summary.note = "output shapes not measured: the models are sharded among processes"
        return summary
    if any(is_lazy(p) for p in pipeline.parameters()):
        # A forward would initialise lazy modules here instead of in the first training
        # step, drawing their weights from a different point of the RNG stream.
        summary.note = "output shapes not measured: the pipeline has lazy modules"
        return summary

    def record(module: nn.Module, inputs: Any, output: Any) -> None:
        layer = layers[module]
        layer.shape, layer.output_bytes = describe_output(output)

    handles = [module.register_forward_hook(record) for module in layers]
    try:
        # Eager even when the models are compiled: a compiled model would bake these hooks
        # into the graph it compiles for this pass (and compiling a side pass costs time).
        with observing(pipeline), running_eagerly(bool(run.compiled_models)):
            batch = sample_batch(run.train_data)
            summary.batch_size = batch_size_of(batch)
            batch = to_device(batch, run.device)
            with run.precision.autocast():
                for component in pipeline.components.values():
                    if isinstance(component, Statistic) or not component.output_specs():
                        continue
                    inputs = {k: batch[component.stream_name(k)] for k in component.input_specs()}
                    for key, value in component(inputs).items():
                        batch[component.stream_name(key)] = value
    except Exception as error:  # analysis must never stop a run that would train
        summary.note = f"output shapes not measured: {type(error).__name__}: {error}"
    finally:
        for handle in handles:
            handle.remove()
    summary.memory_mb = memory_estimate(pipeline, run.optimizer, summary.layers)
    return summary


def optimizer_slots(optimizer: torch.optim.Optimizer) -> int:
    """Tensors of state the optimizer keeps per trainable weight: SGD one with momentum
    (else none), AMSGrad three, anything else taken as Adam-like (two moments)."""
    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    if isinstance(optimizer, torch.optim.SGD):
        return 1 if group.get("momentum") else 0
    return 3 if group.get("amsgrad") else 2


def memory_estimate(
    pipeline: Pipeline, optimizer: torch.optim.Optimizer, layers: list[Layer]
) -> dict[str, float]:
    weights = sum(p.numel() * p.element_size() for p in pipeline.parameters())
    trainable = sum(p.numel() * p.element_size() for p in pipeline.parameters() if p.requires_grad)
    estimate = {
        "parameters": weights / MB,
        "gradients": trainable / MB,
        "optimizer state": optimizer_slots(optimizer) * trainable / MB,
        "activations": sum(layer.output_bytes for layer in layers) / MB,
    }
    estimate["total"] = sum(estimate.values())
    return estimate


def summary_markdown(summary: Summary, optimizer: str) -> str:
    lines = [
        "# Model summary",
        "",
        "| component | type | trainable | frozen |",
        "|---|---|---:|---:|",
    ]
    lines += [f"| {n} | {t} | {a:,} | {f:,} |" for n, t, a, f in summary.components]
    total = sum(a + f for _, _, a, f in summary.components)
    trainable = sum(a for _, _, a, _ in summary.components)
    lines += ["", f"{total:,} parameters, {trainable:,} trainable.", ""]
    lines += [
        f"## Layers (output shapes of one training batch of {summary.batch_size})",
        "",
        "| component | layer | type | output shape | parameters |",
        "|---|---|---|---|---:|",
    ]
    lines += [
        f"| {x.component} | {x.name or '(itself)'} | {x.kind} | {x.shape} | {x.parameters:,} |"
        for x in summary.layers
    ]
    if summary.note:
        lines += ["", f"Note: {summary.note}."]
    lines += ["", f"## Memory estimate (MB; {optimizer} state)", ""]
    lines += ["| part | MB |", "|---|---:|"]
    lines += [f"| {part} | {mb:.2f} |" for part, mb in summary.memory_mb.items()]
    lines += [
        "",
        "Activations are the layer outputs of the batch above (kept for the backward pass);",
        "framework overhead and the data loader's buffers are not included.",
    ]
    return "\n".join(lines) + "\n"


class ModelSummary(Hook):
    """Writes `reports/model_summary.md` before training starts and logs its headline."""

    name = "model_summary"

    def __init__(self, config: AnalysisConfig) -> None:
        self.config = config
        self.summary: Summary | None = None

    def before_train(self, run: RunView) -> None:
        summary = self.summary = measure(run)
        folder = run.run_dir / "reports"
        folder.mkdir(exist_ok=True)
        optimizer = type(run.optimizer).__name__
        write_text_atomic(folder / "model_summary.md", summary_markdown(summary, optimizer))
        for name, kind, trainable, frozen in summary.components:
            if trainable or frozen:
                run.log.info(
                    "model summary: %s (%s): %s parameters (%s trainable)",
                    name,
                    kind,
                    f"{trainable + frozen:,}",
                    f"{trainable:,}",
                )
        memory = summary.memory_mb
        if memory:
            run.log.info(
                "model summary: about %.1f MB for training with batches of %d "
                "(weights %.1f, gradients %.1f, optimizer %.1f, activations %.1f); "
                "see reports/model_summary.md",
                memory["total"],
                summary.batch_size,
                memory["parameters"],
                memory["gradients"],
                memory["optimizer state"],
                memory["activations"],
            )
