"""Joining int8 chains that follow each other, for eager static quantization (eager_static.py).

Eager mode brackets each chain of supported layers in a plain `nn.Sequential` with its own
quant and dequant stub, since it cannot see the `forward` that calls the Sequentials. When
that forward passes one Sequential's output straight into another (LeNet-5's
`classifier(features(x))`), the dequantize at the end of the first and the quantize at the
start of the second only round-trip the tensor through float: measured on LeNet-5 at batch
32 on one thread, the pair cost 1.6% of the int8 time (docs/benchmarks.md). torch.fx shows
the forward's data flow with the Sequentials as leaves; where the first's output goes to the
second alone, both stubs go (each layer takes its wrapper's place again, as in the float
model) and the int8 tensor flows on. A forward fx cannot trace keeps its stubs.
"""

from __future__ import annotations

import warnings

import torch.fx
from torch import nn

from torchloom.core.component import Model


class _Boundaries(torch.fx.Tracer):
    """A tracer that stops at the chains' Sequentials (it does not trace inside them)."""

    def __init__(self, leaves: set[str]) -> None:
        super().__init__()
        self.leaves = leaves

    def is_leaf_module(self, module: nn.Module, qualified_name: str) -> bool:
        return qualified_name in self.leaves or super().is_leaf_module(module, qualified_name)


def join_adjacent_chains(
    component: Model, ends: dict[str, nn.Sequential], starts: dict[str, nn.Sequential]
) -> list[tuple[str, str]]:
    """`ends`: path -> a Sequential whose last child ends a chain with a dequant stub (as
    `Sequential(layer, DeQuantStub)`); `starts`: path -> one whose first child starts a chain
    with a quant stub (`Sequential(QuantStub, layer)`). Returns the (end, start) pairs joined."""
    if not ends or not starts:
        return []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # fx's notes on what it traced; a failure is enough
            graph = _Boundaries(set(ends) | set(starts)).trace(component)
    except Exception:  # data-dependent control flow, a dict fx cannot index ...: keep the stubs
        return []
    calls: dict[str, list[torch.fx.Node]] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            calls.setdefault(str(node.target), []).append(node)
    joined = []
    for end_path, end in ends.items():
        for start_path, start in starts.items():
            if len(calls.get(end_path, [])) != 1 or len(calls.get(start_path, [])) != 1:
                continue  # a Sequential called twice, or not at all: no single data flow
            (producer,), (consumer,) = calls[end_path], calls[start_path]
            if list(producer.users) == [consumer] and consumer.args == (producer,):
                if consumer.kwargs:
                    continue
                _drop_stub(end, -1, 1)
                _drop_stub(start, 0, 0)
                joined.append((end_path, start_path))
    return joined


def _drop_stub(sequential: nn.Sequential, child: int, stub: int) -> None:
    """The wrapper at position `child` (a stub and a layer) gives way to its layer: the
    layer's place, and so its state-dict keys, are those of the float model again."""
    wrapper = sequential[child]
    assert isinstance(wrapper, nn.Sequential) and len(wrapper) == 2
    sequential[child] = wrapper[1 - stub]
