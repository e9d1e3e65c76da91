"""PT2E (torchao 0.18: prepare_pt2e + X86InductorQuantizer + convert_pt2e, then torch.compile
with freezing, per batch shape) against `loom quantize`'s eager static route and against
compiled float, on LeNet-5 (MNIST-sized) or torchvision's ResNet-18 (32x32), with random
weights (latency does not depend on training). One thread; the calls take turns in blocks.

    python benchmarks/pt2e.py lenet5|resnet18 [--repeats 30]

Why: docs/deployment.md ("Routes, and why") chooses the route per mode from these figures.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings
from collections.abc import Callable

import torch
import torch._inductor.config as inductor_config
import torch.ao.quantization as tq
import torchvision
from torch import nn
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)
from torchvision.models.quantization import resnet18 as quantizable_resnet18


class LeNet5(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 6, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.classifier = nn.Sequential(
            nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def timed(calls: dict[str, Callable], x: torch.Tensor, repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in calls}
    with torch.no_grad():
        for call in calls.values():
            for _ in range(3):
                call(x)
        while any(len(values) < repeats for values in times.values()):
            for name, call in calls.items():
                call(x)
                for _ in range(5):
                    started = time.perf_counter()
                    call(x)
                    times[name].append((time.perf_counter() - started) * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


def models(which: str) -> tuple[nn.Module, nn.Module, tuple[int, ...]]:
    """The float model and the eager static int8 one (fused, as `loom quantize` does)."""
    torch.backends.quantized.engine = "x86"
    if which == "resnet18":
        float_model = torchvision.models.resnet18(num_classes=10).eval()
        shape: tuple[int, ...] = (3, 32, 32)
        eager = quantizable_resnet18(weights=None, quantize=False, num_classes=10).eval()
        eager.load_state_dict(float_model.state_dict())
        eager.fuse_model(is_qat=False)
    else:
        float_model, shape = LeNet5().eval(), (1, 28, 28)
        inner = copy.deepcopy(float_model)
        tq.fuse_modules(inner.features, [["0", "1"], ["3", "4"]], inplace=True)
        tq.fuse_modules(inner.classifier, [["0", "1"], ["2", "3"]], inplace=True)
        eager = nn.Sequential(tq.QuantStub(), inner, tq.DeQuantStub())
    eager.qconfig = tq.get_default_qconfig("x86")
    tq.prepare(eager, inplace=True)
    with torch.no_grad():
        for _ in range(4):
            eager(torch.rand(32, *shape))
    tq.convert(eager, inplace=True)
    return float_model, eager, shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=["lenet5", "resnet18"])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    float_model, eager, shape = models(args.model)
    inductor_config.freezing = True
    for batch in (1, 32):
        x = torch.rand(batch, *shape)
        calls: dict[str, Callable] = {"eager float": float_model, "eager static int8": eager}
        quantizer = X86InductorQuantizer()
        quantizer.set_global(get_default_x86_inductor_quantization_config())
        try:
            exported = torch.export.export(copy.deepcopy(float_model), (x,)).module()
            prepared = prepare_pt2e(exported, quantizer)
        except Exception as error:  # torchao's annotator on a residual block: say so
            print(f"batch {batch}: prepare_pt2e failed: {type(error).__name__}: {error}")
        else:
            with torch.no_grad():
                for _ in range(4):
                    prepared(torch.rand(batch, *shape))
            converted = convert_pt2e(prepared)
            with torch.no_grad():
                started = time.perf_counter()
                calls["compiled PT2E int8"] = torch.compile(converted, dynamic=False)
                calls["compiled PT2E int8"](x)
                print(f"batch {batch}: PT2E int8 compiled in {time.perf_counter() - started:.1f} s")
        with torch.no_grad():
            calls["compiled float"] = torch.compile(copy.deepcopy(float_model), dynamic=False)
            calls["compiled float"](x)
        found = timed(calls, x, args.repeats)
        base = found["eager float"]
        for name, value in found.items():
            print(f"batch {batch}: {name} {value:.3f} ms ({base / value:.2f}x eager float)")
        torch._dynamo.reset()
    with open("/proc/loadavg", encoding="utf-8") as load:
        print(f"load average: {load.read().split()[0]}")


if __name__ == "__main__":
    main()
