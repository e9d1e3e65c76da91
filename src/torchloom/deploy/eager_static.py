"""Static int8 (and quantization-aware training) through `torch.ao.quantization`'s eager mode:
module fusion (conv-bn-relu, linear-relu), quant/dequant stubs around chains of supported
layers, observers, calibration by the caller, conversion.

Eager mode sees modules, not the operations a `forward` does between them, so only what is
known to run as a chain is quantized: runs of consecutive supported children of an
`nn.Sequential` (fused, then bracketed by one quant and one dequant stub), and single
supported layers called from other modules (bracketed alone). Chains that the component's
forward passes one straight into the other (LeNet-5's features and classifier) are joined,
no dequantize and quantize between them (eager_joins.py). Everything else stays in float and
the report says why. A component's own `forward` is never changed.

torchvision's ResNet blocks are supported layers too: each becomes torchvision's quantizable
twin in place (`_quantizable_block`: the residual add-relu through a `FloatFunctional`) and is
fused by its own `fuse_model`, so a ResNet backbone is one int8 chain.

Why this route: 1.95x faster than float for LeNet-5 and 5.5x for ResNet-18 at batch 32 on
this CPU with nothing compiled; PT2E (torchao) needs `torch.compile` per batch shape and was
slower on LeNet-5 (docs/deployment.md). PyTorch deprecates
`torch.ao.quantization`: this module is the route to delete when it goes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.ao.nn.quantized as nnq
import torch.ao.quantization as tq
from torch import nn

from torchloom.core.component import Model
from torchloom.deploy.eager_joins import join_adjacent_chains
from torchloom.deploy.quantizer import (
    WEIGHTED,
    LayerOutcome,
    Plan,
    Quantizer,
    accepted_deprecations,
)
from torchloom.errors import DeployError

# Layers that run on int8 tensors in eager mode; the first four carry weights.
WEIGHTED_SUPPORTED = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)
PASS_THROUGH = (
    nn.ReLU,
    nn.ReLU6,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.Flatten,
    nn.Dropout,
    nn.Identity,
)
# Consecutive layer types fused into one module (what fuse_modules accepts).
FUSIONS: tuple[tuple[type[nn.Module], ...], ...] = (
    (nn.Conv2d, nn.BatchNorm2d, nn.ReLU),
    (nn.Conv1d, nn.BatchNorm1d, nn.ReLU),
    (nn.Conv3d, nn.BatchNorm3d, nn.ReLU),
    (nn.Conv2d, nn.BatchNorm2d),
    (nn.Conv1d, nn.BatchNorm1d),
    (nn.Conv3d, nn.BatchNorm3d),
    (nn.Conv1d, nn.ReLU),
    (nn.Conv2d, nn.ReLU),
    (nn.Conv3d, nn.ReLU),
    (nn.Linear, nn.ReLU),
    (nn.Linear, nn.BatchNorm1d),
    (nn.BatchNorm2d, nn.ReLU),
)


class EagerStaticQuantizer(Quantizer):
    route = "torch.ao eager static (fusion, observers, calibration, convert)"
    needs_calibration = True

    def __init__(self, options: Any, qat: bool = False) -> None:
        super().__init__(options)
        self.qat = qat
        self._prepared: set[int] = set()  # components with something to convert
        # Per component being prepared: the Sequentials whose last child ends a chain and
        # those whose first child starts one (eager_joins.py joins them where they meet).
        self._ends: dict[str, nn.Sequential] = {}
        self._starts: dict[str, nn.Sequential] = {}
        if qat:
            self.route = "torch.ao eager quantization-aware training (fused, fake-quantized)"

    def qconfig(self) -> Any:
        backend = self.options.backend
        if self.qat:
            chosen = tq.get_default_qat_qconfig(backend)
            weight = chosen.weight if self.options.per_channel else tq.default_fused_wt_fake_quant
            return tq.QConfig(activation=chosen.activation, weight=weight)
        chosen = tq.get_default_qconfig(backend)
        weight = chosen.weight if self.options.per_channel else tq.default_weight_observer
        return tq.QConfig(activation=chosen.activation, weight=weight)

    def prepare(self, component: Model, plan: Plan) -> None:
        qconfig = self.qconfig()
        outcomes: dict[str, LayerOutcome] = {}
        self._ends, self._starts = {}, {}
        with accepted_deprecations():
            self._bracket(component, component, "", qconfig, outcomes)
            plan.layers += sorted(outcomes.values(), key=lambda o: o.name)
            if not any(outcome.quantized for outcome in outcomes.values()):
                return  # nothing to observe: the component stays as it is
            if self.qat and component.frozen:  # prepare_qat asserted on its eval mode
                raise DeployError.at(
                    "",
                    component.label,
                    "is frozen (its weights and BatchNorm statistics do not train), and "
                    "quantization-aware training fine-tunes every layer it quantizes",
                    "use --mode static (calibrated, nothing trained), --skip its layers, or "
                    "unfreeze it",
                )
            component.eval()  # traced as it runs once converted
            join_adjacent_chains(component, self._ends, self._starts)
            self._prepared.add(id(component))
            component.train(self.qat)
            if self.qat:
                tq.prepare_qat(component, inplace=True)
                for name, module in component.named_modules():
                    if name.endswith("activation_post_process") and isinstance(
                        module, tq.FakeQuantizeBase
                    ):
                        module.register_forward_pre_hook(_observe_in_training_only)
            else:
                tq.prepare(component, inplace=True)

    def convert(self, component: Model) -> None:
        if id(component) not in self._prepared:
            return
        component.eval()
        with accepted_deprecations():
            tq.convert(component, inplace=True)

    def fit_state(self, component: Model, state: Mapping[str, Any]) -> None:
        """Observers and fake-quantize modules start with empty or one-element buffers
        (min/max, scale, zero point) that a per-channel one resizes when it first observes:
        a QAT checkpoint's are resized here to the saved shapes, so that it loads."""
        owners = dict(component.named_modules())
        for key, value in state.items():
            path, _, name = key.rpartition(".")
            owner = owners.get(path)
            if not isinstance(owner, (tq.FakeQuantizeBase, tq.ObserverBase)):
                continue
            buffer = owner._buffers.get(name)
            if not isinstance(buffer, torch.Tensor) or not isinstance(value, torch.Tensor):
                continue
            if buffer.shape != value.shape:
                buffer.resize_(value.shape)

    # ---- finding the chains -----------------------------------------------------------------
    def _supported(self, component: Model, path: str, module: nn.Module) -> bool:
        if isinstance(module, WEIGHTED_SUPPORTED):
            return not self.skipped(component, path)
        if isinstance(module, PASS_THROUGH):
            return True
        if type(module) in _residual_blocks():
            # A residual block of torchvision's ResNets: quantizable as a whole (below) unless
            # one of its layers is to stay in float.
            return not any(
                self.skipped(component, _join(path, inner))
                for inner, layer in module.named_modules()
                if isinstance(layer, WEIGHTED)
            )
        if type(module) is nn.Sequential and len(module) > 0:
            return all(
                self._supported(component, _join(path, n), m) for n, m in module.named_children()
            )
        return False

    def _bracket(
        self,
        component: Model,
        module: nn.Module,
        path: str,
        qconfig: Any,
        outcomes: dict[str, LayerOutcome],
    ) -> None:
        children = list(module.named_children())
        # Only a plain Sequential is known to run its children as a chain (a subclass may
        # override forward).
        if type(module) is nn.Sequential:
            runs = self._runs(component, path, children)
            covered = {name for run in runs for name, _ in run}
            for run in runs:
                self._quantize_run(component, module, path, run, qconfig, outcomes)
            children = [(n, m) for n, m in children if n not in covered]
        for name, child in children:
            child_path = _join(path, name)
            if isinstance(child, WEIGHTED_SUPPORTED) and self._supported(
                component, child_path, child
            ):
                # Called from a forward we cannot see into: quantized alone, between stubs.
                setattr(module, name, _bracketed([child], qconfig))
                outcomes[child_path] = self._outcome(component, child_path, child, True)
            elif isinstance(child, WEIGHTED):
                outcomes[child_path] = self._outcome(component, child_path, child, False)
            else:
                self._bracket(component, child, child_path, qconfig, outcomes)

    def _runs(
        self, component: Model, path: str, children: list[tuple[str, nn.Module]]
    ) -> list[list[tuple[str, nn.Module]]]:
        """Maximal runs of supported children that hold at least one layer with weights."""
        runs, current = [], []
        for name, child in [*children, ("", nn.Module())]:  # a sentinel ends the last run
            if name and self._supported(component, _join(path, name), child):
                current.append((name, child))
                continue
            if any(_has_weights(m) for _, m in current):
                runs.append(current)
            current = []
        return runs

    def _quantize_run(
        self,
        component: Model,
        sequential: nn.Module,
        path: str,
        run: list[tuple[str, nn.Module]],
        qconfig: Any,
        outcomes: dict[str, LayerOutcome],
    ) -> None:
        for name, child in run:
            for inner, layer in child.named_modules():
                if isinstance(layer, WEIGHTED):
                    full = _join(_join(path, name), inner)
                    outcomes[full] = self._outcome(component, full, layer, True)
        self._fuse(sequential, run)
        for _, child in run:
            self._fuse_nested(child)
        names = [name for name, _ in run]
        for name in names:
            getattr(sequential, name).qconfig = qconfig
        first, last = names[0], names[-1]
        quant, dequant = tq.QuantStub(qconfig), tq.DeQuantStub(qconfig)
        # Indices and names of the Sequential stay as they were: the stubs go inside the
        # first and last child's place.
        if first == last:
            setattr(sequential, first, _bracketed([getattr(sequential, first)], qconfig))
            return
        setattr(
            sequential,
            first,
            _with_qconfig(nn.Sequential(quant, getattr(sequential, first)), qconfig),
        )
        setattr(
            sequential,
            last,
            _with_qconfig(nn.Sequential(getattr(sequential, last), dequant), qconfig),
        )
        children = [name for name, _ in sequential.named_children()]
        if type(sequential) is nn.Sequential and first == children[0]:
            self._starts[path] = sequential
        if type(sequential) is nn.Sequential and last == children[-1]:
            self._ends[path] = sequential

    def _fuse(self, sequential: nn.Module, run: list[tuple[str, nn.Module]]) -> None:
        groups: list[list[str]] = []
        index = 0
        while index < len(run):
            for pattern in FUSIONS:
                window = run[index : index + len(pattern)]
                if len(window) == len(pattern) and all(
                    type(m) is kind for (_, m), kind in zip(window, pattern, strict=True)
                ):
                    groups.append([name for name, _ in window])
                    index += len(pattern)
                    break
            else:
                index += 1
        if not groups:
            return
        fuse = tq.fuse_modules_qat if self.qat else tq.fuse_modules
        sequential.train(self.qat)
        fuse(sequential, groups, inplace=True)

    def _fuse_nested(self, module: nn.Module) -> None:
        """A supported child of a run, inside: plain Sequentials fused as a run is, residual
        blocks made quantizable (`_quantizable_block`) and fused by their own `fuse_model`."""
        if type(module) in _residual_blocks():
            block = _quantizable_block(module)
            block.train(self.qat)  # the modules it added too: fusion wants one mode
            block.fuse_model(is_qat=self.qat)
            return
        if type(module) is not nn.Sequential:
            return
        self._fuse(module, list(module.named_children()))
        for child in module.children():
            self._fuse_nested(child)

    def _outcome(
        self, component: Model, path: str, layer: nn.Module, quantized: bool
    ) -> LayerOutcome:
        name, kind = f"{component.name}.{path}", type(layer).__name__
        if quantized:
            return LayerOutcome(name, kind, True)
        if self.skipped(component, path):
            return LayerOutcome(name, kind, False, "skipped (--skip)")
        if isinstance(layer, (nn.LSTM, nn.GRU, nn.RNN)):
            why = f"static eager quantization has no int8 {kind}; --mode dynamic quantizes it"
        else:
            why = f"static eager quantization has no int8 {kind}"
        return LayerOutcome(name, kind, False, why)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path and name else path or name


def _has_weights(module: nn.Module) -> bool:
    return any(isinstance(m, WEIGHTED_SUPPORTED) for m in module.modules())


def _with_qconfig(module: nn.Module, qconfig: Any) -> nn.Module:
    module.qconfig = qconfig
    return module


def _bracketed(modules: list[nn.Module], qconfig: Any) -> nn.Module:
    return _with_qconfig(
        nn.Sequential(tq.QuantStub(qconfig), *modules, tq.DeQuantStub(qconfig)), qconfig
    )


def _observe_in_training_only(module: nn.Module, _: Any) -> None:
    """An activation's fake-quantize observer follows training batches only: the
    fine-tuning run's validation and test passes (eval mode) use its range, never move it,
    so the converted model's scales owe nothing to the data it is evaluated on. (Weights'
    observers see only weights, and must see the final ones when converted.)"""
    enabled = module.observer_enabled
    assert isinstance(enabled, torch.Tensor)
    enabled[0] = 1 if module.training else 0


def _residual_blocks() -> dict[type[nn.Module], type[nn.Module]]:
    """torchvision's ResNet blocks, each with its quantizable twin (torchvision's own, as in
    its quantized ResNets): the same layers and weights, the residual addition and its ReLU
    done by a `FloatFunctional` that becomes one int8 add-relu, and `fuse_model` fusing
    conv-bn(-relu) and the downsampling conv-bn. Without them a block's convs would each be
    quantized alone, between stubs, with their batch norms in float."""
    from torchvision.models import resnet
    from torchvision.models.quantization import resnet as quantizable

    return {
        resnet.BasicBlock: quantizable.QuantizableBasicBlock,
        resnet.Bottleneck: quantizable.QuantizableBottleneck,
    }


def _quantizable_block(block: nn.Module) -> Any:
    """`block` turned into its quantizable twin in place: its class, and the modules the
    twin's forward adds (its weights, names and state-dict keys stay as they were)."""
    twin = _residual_blocks()[type(block)]
    block.__class__ = twin
    if twin.__name__ == "QuantizableBasicBlock":
        block.add_relu = nnq.FloatFunctional()
    else:  # the bottleneck's forward uses one ReLU per place, not one shared ReLU
        block.skip_add_relu = nnq.FloatFunctional()
        block.relu1 = nn.ReLU(inplace=False)
        block.relu2 = nn.ReLU(inplace=False)
    return block
