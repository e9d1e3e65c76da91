"""Dynamic int8 through `torch.ao.quantization.quantize_dynamic` (eager mode): int8 weights,
activations quantized on the fly, for `nn.Linear`, `nn.LSTM` and `nn.GRU` children of a model
component.

Why this route: torchao's `quantize_` touches `nn.Linear` only and is slower than float on a
CPU without `torch.compile`; dynamic LSTM/GRU quantization exists only here. PyTorch deprecates
`torch.ao.quantization`: this module is the route to delete when it goes.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch
import torch.ao.nn.quantized.dynamic as nnqd
import torch.ao.quantization as tq
from torch import nn

from torchloom.core.component import Model
from torchloom.deploy.quantizer import (
    WEIGHTED,
    LayerOutcome,
    Plan,
    QuantizeOptions,
    Quantizer,
    accepted_deprecations,
)

DYNAMIC_TYPES = (nn.Linear, nn.LSTM, nn.GRU)


class EagerDynamicQuantizer(Quantizer):
    route = "torch.ao eager quantize_dynamic (int8 weights, dynamic int8 activations)"

    def __init__(self, options: QuantizeOptions) -> None:
        super().__init__(options)
        # Per component (its id): the layers `prepare` chose, by module path, with their
        # qconfig. Several components are prepared before any is converted.
        self._chosen: dict[int, dict[str, object]] = {}

    def prepare(self, component: Model, plan: Plan) -> None:
        chosen = self._chosen[id(component)] = {}
        linear_qconfig = (
            tq.per_channel_dynamic_qconfig
            if self.options.per_channel
            else tq.default_dynamic_qconfig
        )
        for path, module in component.named_modules():
            if not isinstance(module, WEIGHTED) or module is component:
                continue
            name = f"{component.name}.{path}"
            kind = type(module).__name__
            if self.skipped(component, path):
                plan.layers.append(LayerOutcome(name, kind, False, "skipped (--skip)"))
            elif not isinstance(module, DYNAMIC_TYPES):
                plan.layers.append(
                    LayerOutcome(name, kind, False, f"dynamic quantization has no int8 {kind}")
                )
            else:
                # LSTM/GRU have per-tensor dynamic kernels only.
                qconfig = (
                    linear_qconfig if isinstance(module, nn.Linear) else tq.default_dynamic_qconfig
                )
                chosen[path] = qconfig
                plan.layers.append(LayerOutcome(name, kind, True))

    def convert(self, component: Model) -> None:
        chosen = self._chosen.pop(id(component), None)
        if not chosen:
            return
        with accepted_deprecations():
            tq.quantize_dynamic(component, chosen, dtype=torch.qint8, inplace=True)


# ---- saving and loading ---------------------------------------------------------------------
# A dynamic int8 LSTM/GRU keeps its weights packed in TorchScript objects: `torch.load` with
# `weights_only=True` refuses them, and no digest can read them. A quantized folder holds
# them as plain tensors instead (int8 weights with their scales, float biases), under
# `<layer>.weight_bias.<torch's name>`, and the loaded layer packs them again.
PACKED, PLAIN = "_all_weight_values.", "weight_bias."


def savable_state(component: nn.Module) -> dict[str, Any]:
    """`component.state_dict()` with every dynamic int8 LSTM/GRU's weights as plain tensors
    (the same dict for a component without one)."""
    state = component.state_dict()
    for path, rnn in _dynamic_rnns(component):
        for key in [k for k in state if k.startswith(f"{path}.{PACKED}")]:
            del state[key]
        for part in rnn._weight_bias().values():
            state.update({f"{path}.{PLAIN}{n}": t.detach() for n, t in part.items()})
    return state


def load_savable_state(component: nn.Module, saved: dict[str, Any]) -> None:
    """Load what `savable_state` gave into a component converted as it was (strict)."""
    state = copy.copy(saved)  # its _metadata too: the layers' versions, which loading reads
    for path, rnn in _dynamic_rnns(component):
        prefix = f"{path}.{PLAIN}"
        rnn.set_weight_bias(
            {k[len(prefix) :]: state.pop(k) for k in list(state) if k.startswith(prefix)}
        )
        packed = f"{path}.{PACKED}"
        state.update({k: v for k, v in component.state_dict().items() if k.startswith(packed)})
    component.load_state_dict(state)


def _dynamic_rnns(component: nn.Module) -> Iterator[tuple[str, nnqd.LSTM | nnqd.GRU]]:
    for path, module in component.named_modules():
        if isinstance(module, nnqd.LSTM | nnqd.GRU):
            yield path, module
