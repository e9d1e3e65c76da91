"""The one interface behind `loom quantize`: a `Quantizer` turns a model component into its int8
form in place, and says what it did to each layer with weights.

A route is a module that subclasses `Quantizer` (`eager_dynamic.py`, `eager_static.py`);
`choose_quantizer(mode)` picks it. The routes were chosen by measurement on this project's
CPU (docs/deployment.md): `torch.ao`'s eager dynamic quantization is the only one that handles
LSTM/GRU children and is 2-4x faster than float for wide linear layers at batch 32; eager
static quantization with fusion is 1.6-2x faster than float for LeNet-5 and 4.3x for ResNet-18
(32x32) at batch 32 without `torch.compile`. PT2E (torchao's X86InductorQuantizer, compiled
per batch shape) was slower than both eager int8 and compiled float on LeNet-5 and fails to
annotate torchvision's residual blocks (benchmarks/pt2e.py). PyTorch deprecates
`torch.ao.quantization`; when it goes, deleting those modules and adding a PT2E route here is
the whole change.

The steps, which `loom quantize` and reloading a quantized folder share:
`prepare(component)` rewrites the module tree (fusion, quant/dequant stubs, observers);
`calibrate` is the caller running batches through the prepared model (static only);
`convert(component)` swaps in the int8 modules. Reloading runs prepare and convert on a fresh
component and then loads the saved state dict, so no pickled module is ever loaded.
"""

from __future__ import annotations

import contextlib
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from torchloom.core.component import Model
from torchloom.errors import DeployError, Problem, did_you_mean

MODES = ("dynamic", "static", "qat")
BACKENDS = ("x86", "onednn", "qnnpack")
# Modules with weights that a report lists, quantized or not.
WEIGHTED = (
    nn.Linear,
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.LSTM,
    nn.GRU,
    nn.RNN,
    nn.Embedding,
    nn.EmbeddingBag,
    nn.MultiheadAttention,
)

# The deprecation warnings torch.ao's eager quantization gives on every use, accepted
# knowingly (the route is kept until torch removes it; see the module docstring), and only
# these: any other warning still shows.
ACCEPTED_WARNINGS = (
    (DeprecationWarning, r"torch\.ao\.quantization is deprecated"),
    (UserWarning, r"torch\.quantize_per_tensor, torch\.quantize_per_channel and other quantized"),
    (UserWarning, r"TypedStorage is deprecated"),
    (UserWarning, r"must run observer before calling calculate_qparams"),
    (UserWarning, r"Please use quant_min and quant_max to specify the range for observers"),
)


@contextlib.contextmanager
def accepted_deprecations() -> Iterator[None]:
    with warnings.catch_warnings():
        for category, message in ACCEPTED_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category)
        yield


@contextlib.contextmanager
def quantized_engine(backend: str) -> Iterator[None]:
    """Run int8 kernels of `backend` (x86, onednn, qnnpack) inside the block."""
    if backend not in torch.backends.quantized.supported_engines:
        supported = ", ".join(
            e for e in BACKENDS if e in torch.backends.quantized.supported_engines
        )
        raise DeployError.at(
            "command line",
            f"--backend {backend}",
            "this build of torch has no such quantized engine",
            f"supported here: {supported}",
        )
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = backend
    try:
        yield
    finally:
        torch.backends.quantized.engine = previous


@dataclass(frozen=True)
class QuantizeOptions:
    mode: str
    backend: str = "x86"
    per_channel: bool = True
    skip: tuple[str, ...] = ()  # layers kept in float: "component.path.in.module"

    def record(self) -> dict[str, Any]:
        return {**asdict(self), "skip": list(self.skip)}


@dataclass
class LayerOutcome:
    """What happened to one layer with weights: quantized, or left in float and why."""

    name: str  # component name + module path, e.g. image_classifier.features.0
    kind: str  # the float module's class name
    quantized: bool
    reason: str = ""


@dataclass
class Plan:
    """What `prepare` did, per layer, and which components it touched."""

    layers: list[LayerOutcome] = field(default_factory=list)

    @property
    def quantized(self) -> list[LayerOutcome]:
        return [layer for layer in self.layers if layer.quantized]

    @property
    def left_float(self) -> list[LayerOutcome]:
        return [layer for layer in self.layers if not layer.quantized]


class Quantizer(ABC):
    """One route from a float model component to an int8 one (in place)."""

    route: str = ""  # what the report calls it
    needs_calibration: ClassVar[bool] = False

    def __init__(self, options: QuantizeOptions) -> None:
        self.options = options

    @abstractmethod
    def prepare(self, component: Model, plan: Plan) -> None:
        """Rewrite `component` for quantization, adding a `LayerOutcome` per weighted layer."""

    @abstractmethod
    def convert(self, component: Model) -> None:
        """Swap the prepared (and calibrated) modules for int8 ones."""

    def fit_state(self, component: Model, state: Mapping[str, Any]) -> None:
        """Before `state`, saved from a prepared component, is loaded into this prepared one:
        give buffers whose shape the saved ones fixed only once observed (per-channel scales)
        the saved shapes. Nothing by default."""
        return None

    def skipped(self, component: Model, path: str) -> bool:
        return f"{component.name}.{path}" in self.options.skip


def weighted_layers(components: Sequence[Model]) -> list[str]:
    return [
        f"{c.name}.{path}"
        for c in components
        for path, m in c.named_modules()
        if isinstance(m, WEIGHTED)
    ]


def check_skip(options: QuantizeOptions, components: Sequence[Model]) -> None:
    """Every `--skip` name is a layer with weights of a model component."""
    known = weighted_layers(components)
    problems = [
        Problem(
            "command line",
            f"--skip {name}",
            "is not a layer with weights of a model component",
            did_you_mean(name, known) or f"layers: {', '.join(known[:12])}",
        )
        for name in options.skip
        if name not in known
    ]
    if problems:
        raise DeployError(problems)


def choose_quantizer(options: QuantizeOptions) -> Quantizer:
    """The route for a mode (see the module docstring for why these)."""
    if options.mode not in MODES:
        raise DeployError.at(
            "command line",
            f"--mode {options.mode}",
            "is not a quantization mode",
            did_you_mean(options.mode, MODES) or f"modes: {', '.join(MODES)}",
        )
    if options.backend not in BACKENDS:
        raise DeployError.at(
            "command line",
            f"--backend {options.backend}",
            "is not a quantization backend",
            did_you_mean(options.backend, BACKENDS) or f"backends: {', '.join(BACKENDS)}",
        )
    if options.mode == "dynamic":
        from torchloom.deploy.eager_dynamic import EagerDynamicQuantizer

        return EagerDynamicQuantizer(options)
    from torchloom.deploy.eager_static import EagerStaticQuantizer

    return EagerStaticQuantizer(options, qat=options.mode == "qat")
