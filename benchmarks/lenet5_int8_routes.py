"""LeNet-5 static int8 through torchloom's route (`deploy/eager_static.py`) against a minimal
hand-written torch.ao eager static quantization of the same trained LeNet5 module, and float,
timed side by side (turns of warm blocks, one thread): what our route loses, if anything.

Hand-written variants: QuantStub -> features -> classifier -> DeQuantStub -> log_softmax with
conv+relu and linear+relu fused (`fuse_modules`), calibrated on the same 16 batches of 32 as
ours; per-channel (x86 default) or per-tensor weights, the fbgemm qconfig, with an extra
dequantize/quantize between features and classifier (what our route did before its chains
were joined), and without the final log_softmax. Each batch size is timed on fresh copies
of every model, first called at that size (see deploy/quantize.py, `_latency`).

    python benchmarks/lenet5_int8_routes.py RUN_DIR [--repeats 300]

RUN_DIR: a trained run of configs/mnist/lenet5.yml (`benchmarks/quantize.py` makes one).
"""

from __future__ import annotations

import argparse
import copy
import functools
import os

import torch
import torch.ao.quantization as tq
from torch import nn

from torchloom.deploy.eager_static import EagerStaticQuantizer
from torchloom.deploy.graph import graph_batch, model_graph, replaced
from torchloom.deploy.measure import machine, paired_latency_ms
from torchloom.deploy.quantizer import (
    Plan,
    QuantizeOptions,
    accepted_deprecations,
    quantized_engine,
)
from torchloom.deploy.run_model import load_trained_run


class HandLeNet5(nn.Module):
    def __init__(self, source: nn.Module, split: bool, log_softmax: bool) -> None:
        super().__init__()
        self.features = copy.deepcopy(source.features)
        self.classifier = copy.deepcopy(source.classifier)
        self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
        self.split, self.log_softmax = split, log_softmax
        self.middle = nn.Sequential(tq.DeQuantStub(), tq.QuantStub()) if split else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.dequant(self.classifier(self.middle(self.features(self.quant(x)))))
        return torch.log_softmax(x, dim=1) if self.log_softmax else x


def hand_written(
    source: nn.Module,
    qconfig: tq.QConfig,
    calibration: list[torch.Tensor],
    split: bool = False,
    log_softmax: bool = True,
) -> nn.Module:
    model = HandLeNet5(source, split, log_softmax).eval()
    pairs = [["features.0", "features.1"], ["features.3", "features.4"]]
    pairs += [["classifier.0", "classifier.1"], ["classifier.2", "classifier.3"]]
    tq.fuse_modules(model, pairs, inplace=True)
    model.qconfig = qconfig
    tq.prepare(model, inplace=True)
    with torch.no_grad():
        for batch in calibration:
            model(batch)
    tq.convert(model, inplace=True)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--backend", default="x86")
    args = parser.parse_args()
    torch.set_num_threads(1)
    pipeline = load_trained_run(args.run_dir).pipeline
    graph = model_graph(pipeline, "test").eval()
    (images,) = graph.example_inputs(graph_batch(pipeline, "test", graph, 512))
    calibration = [images[i : i + 32] for i in range(0, 512, 32)]
    (model,) = pipeline.models
    float_model = copy.deepcopy(model).eval()
    with quantized_engine(args.backend), accepted_deprecations():
        quantizer = EagerStaticQuantizer(QuantizeOptions("static", args.backend))
        quantizer.prepare(model, Plan())
        with torch.no_grad():
            for batch in calibration:
                graph(batch)
        quantizer.convert(model)
        default = tq.get_default_qconfig(args.backend)
        per_tensor = tq.QConfig(activation=default.activation, weight=tq.default_weight_observer)
        calls = {
            "float (pipeline graph)": replaced(graph, {model.name: float_model}),
            "torchloom int8 (pipeline graph)": graph,
            "hand int8 per-channel": hand_written(float_model, default, calibration),
            "hand int8 per-tensor": hand_written(float_model, per_tensor, calibration),
            "hand int8 fbgemm qconfig": hand_written(
                float_model, tq.get_default_qconfig("fbgemm"), calibration
            ),
            "hand int8, dequant/quant between": hand_written(
                float_model, default, calibration, split=True
            ),
            "hand int8, no log_softmax": hand_written(
                float_model, default, calibration, log_softmax=False
            ),
        }
        print(f"machine: {machine()}, 1 thread, {args.repeats} timed runs per figure")
        for size in (32, 1):
            batch = images[:size].contiguous()
            load = os.getloadavg()[0]
            # Fresh copies first called at this size: oneDNN int8 convolutions keep a fast
            # path for the shape of their first call only (deploy/quantize.py, _latency).
            fresh = {name: copy.deepcopy(call) for name, call in calls.items()}
            medians = paired_latency_ms(
                {name: functools.partial(call, batch) for name, call in fresh.items()},
                args.repeats,
                block=20,
            )
            base = medians["float (pipeline graph)"]
            print(f"batch {size} (load average {load:.2f}):")
            for name, value in medians.items():
                print(f"  {name:34s} {value:7.3f} ms   float/this {base / value:5.2f}x")


if __name__ == "__main__":
    main()
