"""Layer statistics: activation mean/std/min/max and gradient norms per layer of every model.

Measured on the first training step of a run (so that a run shorter than the interval has
its numbers too) and then every `interval` episodes (default: the logging interval), each time
on one training batch:

    reports/layer_statistics.csv      episode, epoch, layer, activation_*, gradient_norm
    TensorBoard                       layers/<component>.<layer>/activation_mean, ...

and a warning in run.log when a layer's gradient norm is below `vanishing` or above
`exploding`. Layers are the leaf modules of each model component (activations), plus any
module that holds parameters itself (gradients).

Nothing runs on the other steps. The engine zeroes gradients (set to None) in its optimizer
step, before `after_step`, so `.grad` is gone by then; instead, `after_step` of the episode
before a measured one registers forward hooks on the layers and tensor hooks on their
parameters, the measured step's forward and backward fill them (device tensors, no sync), and
its `after_step` removes the hooks and reads everything back in one copy. Tensor hooks see the
gradient of that batch's backward (with gradient accumulation: that batch's share), before
clipping, unscaled here when fp16 loss scaling is on. Forward hooks ignore evaluation passes
(the pipeline is then in eval mode), which may run while they are registered. With
`training.compile` the measured step runs the models eagerly (`needs_eager_step`): a compiled
model would not call the forward hooks, and the activation columns would stay empty.

With several processes (DDP) each holds its share of the global batch, and its tensor hooks
see its own share's gradient, before DDP averages them: the figures are the global batch's,
as one process computes them. The gradients kept on a measured step are averaged over the
processes (one all-reduce, every interval), the activations' per-call figures gathered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from torchloom.analysis.schema import AnalysisConfig, LayerStatisticsConfig
from torchloom.analysis.skipped import say_skipped
from torchloom.core.component import Batch
from torchloom.core.pipeline import Pipeline
from torchloom.engine.state import Hook
from torchloom.statistics.csv_log import CsvLog

if TYPE_CHECKING:
    from torchloom.engine.state import RunView

ACTIVATIONS = ("activation_mean", "activation_std", "activation_min", "activation_max")


@dataclass
class Layer:
    """One measured module and what the measured step left in it (device tensors)."""

    name: str  # <component>.<module path>
    module: nn.Module
    leaf: bool
    parameters: list[nn.Parameter]
    # Per call of the module in the step: (elements, [mean, variance, min, max]).
    calls: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    squared_gradients: torch.Tensor | None = None  # sum of squares over its parameters
    # Under DDP, each parameter's local gradient (by index), averaged over processes later.
    gradients: dict[int, torch.Tensor] = field(default_factory=dict)


def find_layers(pipeline: Pipeline) -> list[Layer]:
    """The leaf modules and the parameter-holding modules of every model component."""
    layers = []
    for component in pipeline.models:
        for path, module in component.named_modules():
            leaf = next(module.children(), None) is None
            parameters = [p for p in module.parameters(recurse=False) if p.requires_grad]
            if leaf or parameters:
                name = f"{component.name}.{path}" if path else component.name
                layers.append(Layer(name, module, leaf, parameters))
    return layers


def _first_tensor(output: Any) -> torch.Tensor | None:
    """The activation of a module: its output, or the first tensor of a tuple (an LSTM's)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        return next((t for t in output if isinstance(t, torch.Tensor)), None)
    data = getattr(output, "data", None)  # PackedSequence
    return data if isinstance(data, torch.Tensor) else None


def combine(calls: list[tuple[int, list[float]]]) -> dict[str, float]:
    """Mean, std (over all elements), min and max of a layer's activations over its calls."""
    total = sum(n for n, _ in calls)
    mean = sum(n * s[0] for n, s in calls) / total
    variance = sum(n * (s[1] + (s[0] - mean) ** 2) for n, s in calls) / total
    return {
        "activation_mean": mean,
        "activation_std": math.sqrt(max(variance, 0.0)),
        "activation_min": min(s[2] for _, s in calls),
        "activation_max": max(s[3] for _, s in calls),
    }


class LayerStatistics(Hook):
    """Per-layer activation and gradient statistics on the first step and every `interval`
    episodes."""

    name = "layer_statistics"
    # Under DDP each process measures its share of the batch, averaged and gathered at each
    # measured step (every process takes part; rank 0 writes).
    every_rank = True

    def __init__(self, config: AnalysisConfig) -> None:
        settings = config.settings("layer_statistics")
        assert isinstance(settings, LayerStatisticsConfig)
        self.settings = settings
        self.enabled = config.enabled("layer_statistics")
        self.interval = 1
        self.layers: list[Layer] = []
        self.handles: list[RemovableHandle] = []
        self.pipeline: Pipeline | None = None
        self.csv: CsvLog | None = None
        self.gradient_scale = 1.0
        self.shared = False  # processes each hold a share of the batch (DDP)

    # ---- events ----------------------------------------------------------------------------
    def before_train(self, run: RunView) -> None:
        if not self.enabled:
            return
        self.interval = self.settings.interval or run.logging_interval
        self.pipeline = run.pipeline
        self.layers = find_layers(run.pipeline)
        # FSDP's gradients are shards of one tensor, not shares of a batch: left as they are.
        self.shared = run.distributed.active and not run.sharded_models
        if run.distributed.main:
            folder = run.run_dir / "reports"
            folder.mkdir(parents=True, exist_ok=True)
            # A resumed run drops the rows past its checkpoint, as the engine's CSVs do.
            self.csv = CsvLog(folder / "layer_statistics.csv", run.progress.episode)
        if not self.layers:
            why = "the pipeline has no model component with layers to measure"
            say_skipped(run, ["layer_statistics"], why)
            return
        first = run.progress.episode == 0  # a resumed run measured its first step already
        if first or (run.progress.episode + 1) % self.interval == 0:
            self._register(run)

    def needs_eager_step(self, run: RunView) -> bool:
        return bool(self.handles)  # registered: the coming step is measured

    def after_step(self, run: RunView, batch: Batch, loss: torch.Tensor) -> None:
        if not self.layers:
            return
        episode = run.progress.episode
        if self.handles:
            self._remove()
            self._report(run)
        if (episode + 1) % self.interval == 0:
            self._register(run)

    def after_train(self, run: RunView, summary: dict[str, Any]) -> None:
        self._remove()  # registered for a step that never came

    # ---- measuring -------------------------------------------------------------------------
    def _register(self, run: RunView) -> None:
        scaler = run.precision.scaler
        # The scale the next backward multiplies the loss by (one host read per measurement).
        self.gradient_scale = float(scaler.get_scale()) if scaler is not None else 1.0
        for layer in self.layers:
            layer.calls, layer.squared_gradients, layer.gradients = [], None, {}
            if layer.leaf:
                self.handles.append(
                    layer.module.register_forward_hook(partial(self._on_output, layer))
                )
            for index, parameter in enumerate(layer.parameters):
                hook = partial(self._on_gradient, layer, index)
                self.handles.append(parameter.register_hook(hook))

    def release(self) -> None:
        self._remove()  # a run that ended by an exception left them on the modules

    def _remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _on_output(self, layer: Layer, module: nn.Module, inputs: Any, output: Any) -> None:
        assert self.pipeline is not None
        if not self.pipeline.training:  # an evaluation pass between registering and the step
            return
        activation = _first_tensor(output)
        if activation is None or not activation.is_floating_point() or activation.numel() == 0:
            return
        with torch.no_grad():
            values = activation.detach().float()
            variance, mean = torch.var_mean(values, correction=0)
            layer.calls.append(
                (values.numel(), torch.stack([mean, variance, values.amin(), values.amax()]))
            )

    def _on_gradient(self, layer: Layer, index: int, gradient: torch.Tensor) -> None:
        with torch.no_grad():
            if self.shared:  # a copy: DDP's reduction writes into the gradient's bucket
                layer.gradients[index] = gradient.detach().float().reshape(-1).clone()
                return
            squares = gradient.detach().float().square().sum()
            current = layer.squared_gradients
            layer.squared_gradients = squares if current is None else current + squares

    # ---- reporting -------------------------------------------------------------------------
    def _average_gradients(self, run: RunView) -> None:
        """Each layer's squared gradient norm of the processes' mean gradient (what DDP
        steps with), from one all-reduce; a parameter without a gradient here adds zeros,
        and a layer none of the processes gave a gradient to stays without one."""
        pieces = []
        for layer in self.layers:
            for index, parameter in enumerate(layer.parameters):
                given = layer.gradients.get(index)
                if given is None:  # zeros only where this process has no gradient
                    given = torch.zeros(parameter.numel(), device=run.device)
                pieces.append(given)
            pieces.append(torch.full((1,), float(bool(layer.gradients)), device=run.device))
        flat = run.distributed.sum(torch.cat(pieces))
        sizes = [sum(p.numel() for p in layer.parameters) for layer in self.layers]
        ends = torch.tensor(sizes).add(1).cumsum(0)
        had = (flat[ends.to(flat.device) - 1] > 0).tolist()  # one read, every interval
        for layer, size, end, given in zip(self.layers, sizes, ends.tolist(), had, strict=True):
            mean = flat[end - 1 - size : end - 1] / run.distributed.world
            layer.squared_gradients = mean.square().sum() if given else None
            layer.gradients = {}

    def _report(self, run: RunView) -> None:
        episode, epoch = run.progress.episode, run.progress.epoch + 1  # numbered as logged
        if self.shared:
            self._average_gradients(run)
        # Everything the step left on the device, read back in one copy.
        device_values = [s for layer in self.layers for _, s in layer.calls] + [
            layer.squared_gradients for layer in self.layers if layer.squared_gradients is not None
        ]
        if not device_values and not self.shared:  # every process gathers, if any did
            return
        values = [v.reshape(-1) for v in device_values]
        host = iter(torch.cat(values).cpu().tolist() if values else [])
        calls = {
            layer.name: [(n, [next(host) for _ in range(4)]) for n, _ in layer.calls]
            for layer in self.layers
        }
        if self.shared:  # every process's calls on its share of the batch
            shares = run.distributed.gather(calls)
            calls = {name: [c for share in shares for c in share[name]] for name in calls}
        if not run.distributed.main:  # rank 0 writes the figures
            for layer in self.layers:
                layer.calls, layer.squared_gradients = [], None
            return
        # Under fp16 a non-finite gradient is an overflow, which the scaler's routine handles
        # (it skips the step and lowers its scale, at the end of an accumulation window when
        # there is one): not exploding gradients.
        scaler = run.precision.scaler
        scaled = scaler is not None and scaler.is_enabled()
        vanishing, exploding, overflowed = [], [], []
        writer = run.tensorboard
        for layer in self.layers:
            row: dict[str, Any] = {"episode": episode, "epoch": epoch, "layer": layer.name}
            row.update(combine(calls[layer.name]) if calls[layer.name] else {})
            if layer.squared_gradients is not None:
                norm = math.sqrt(next(host)) / self.gradient_scale
                row["gradient_norm"] = norm
                if norm < self.settings.vanishing:
                    vanishing.append(f"{layer.name} ({norm:.3g})")
                elif scaled and not math.isfinite(norm):
                    overflowed.append(layer.name)
                elif not norm <= self.settings.exploding:  # NaN and inf explode too
                    exploding.append(f"{layer.name} ({norm:.3g})")
            layer.calls, layer.squared_gradients = [], None
            if len(row) == 3:  # neither called nor given a gradient in this step
                continue
            assert self.csv is not None
            self.csv.write(
                {
                    k: row.get(k)
                    for k in ("episode", "epoch", "layer", *ACTIVATIONS, "gradient_norm")
                }
            )
            if writer is not None:
                for key, value in row.items():
                    if key not in ("episode", "epoch", "layer"):
                        writer.add_scalar(f"layers/{layer.name}/{key}", value, episode)
        if vanishing:
            run.log.warning(
                "episode %d: vanishing gradients (norm below %g) in %s",
                episode,
                self.settings.vanishing,
                ", ".join(vanishing),
            )
        if overflowed:
            run.log.info(
                "episode %d: fp16 gradients overflowed in %s at scale %g; the gradient scaler "
                "skips such a step and lowers its scale (its routine, not divergence)",
                episode,
                ", ".join(overflowed),
                self.gradient_scale,
            )
        if exploding:
            run.log.warning(
                "episode %d: exploding gradients (norm above %g) in %s",
                episode,
                self.settings.exploding,
                ", ".join(exploding),
            )
