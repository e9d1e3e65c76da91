"""The Quantizer routes on single components, without a run: which layers each route
quantizes, fuses or leaves in float (and why), and that they do it without a warning."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from torchloom.core.component import Batch, BuildContext, ComponentParams, Model
from torchloom.deploy.quantizer import (
    Plan,
    QuantizeOptions,
    check_skip,
    choose_quantizer,
    quantized_engine,
)
from torchloom.errors import DeployError
from torchloom.zoo.models.recurrent import RecurrentNeuralNetwork


class Residual(Model):
    """A conv-bn-relu stack, then a residual add between two layers called from forward."""

    Params = ComponentParams

    def __init__(self, params: ComponentParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.stem = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
        self.left = nn.Conv2d(4, 4, 3, padding=1)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * 8 * 8, 3))

    def forward(self, inputs: Batch) -> Batch:
        features = self.stem(inputs["x"])
        features = features + self.left(features)  # a float add between two chains
        return {"y": self.head(features)}


def residual() -> Model:
    model = Residual(ComponentParams(), BuildContext(name="net"))
    with torch.no_grad():  # batch statistics that are not the identity
        model.stem[1].running_mean.uniform_(-0.5, 0.5)
        model.stem[1].running_var.uniform_(0.5, 2.0)
    return model.eval()


def quantized(model: Model, options: QuantizeOptions, batch: Batch | None = None) -> Plan:
    quantizer = choose_quantizer(options)
    plan = Plan()
    with warnings.catch_warnings(), quantized_engine(options.backend):
        warnings.simplefilter("error")  # every warning a route gives is filtered, or fails
        quantizer.prepare(model, plan)
        if quantizer.needs_calibration:
            model(batch or {"x": torch.randn(16, 1, 8, 8)})
        quantizer.convert(model)
    return plan


def test_static_fuses_chains_and_brackets_layers_called_from_forward() -> None:
    model = residual()
    x = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        expected = model({"x": x})["y"]
    plan = quantized(model, QuantizeOptions("static"))
    assert [(layer.name, layer.quantized) for layer in plan.layers] == [
        ("net.head.1", True),
        ("net.left", True),
        ("net.stem.0", True),
    ]
    assert type(model.stem[0][1]).__name__ == "ConvReLU2d"  # conv, bn (folded) and relu
    assert (
        type(model.left[1]).__name__ == "Conv2d" and "quantized" in type(model.left[1]).__module__
    )
    with torch.no_grad(), quantized_engine("x86"):
        got = model({"x": x})["y"]
    assert (got - expected).abs().max() < 0.1 * expected.abs().max()


def test_skip_keeps_a_layer_float_and_unknown_names_are_refused() -> None:
    model = residual()
    plan = quantized(model, QuantizeOptions("static", skip=("net.left",)))
    left = next(layer for layer in plan.layers if layer.name == "net.left")
    assert not left.quantized and left.reason == "skipped (--skip)"
    assert isinstance(model.left, nn.Conv2d)
    with pytest.raises(DeployError, match=r"did you mean 'net\.left'"):
        check_skip(QuantizeOptions("static", skip=("net.lef",)), [residual()])


@pytest.mark.parametrize(
    ("mode", "rnn_quantized", "reason"),
    [
        ("dynamic", True, ""),
        ("static", False, "static eager quantization has no int8 GRU; --mode dynamic quantizes it"),
    ],
)
def test_recurrent_layers_by_mode(mode: str, rnn_quantized: bool, reason: str) -> None:
    model = RecurrentNeuralNetwork.create(
        name="rnn", cell_type="GRU", hidden_size=8, globals={"input_size": 5, "prediction_size": 3}
    ).eval()
    plan = quantized(model, QuantizeOptions(mode), {"inputs": torch.randn(4, 6, 5)})
    layers = {layer.kind: layer for layer in plan.layers}
    assert layers["GRU"].quantized is rnn_quantized and layers["GRU"].reason == reason
    assert layers["Linear"].quantized


def test_dynamic_leaves_convolutions_in_float_and_says_why() -> None:
    plan = quantized(residual(), QuantizeOptions("dynamic"))
    reasons = {layer.name: layer.reason for layer in plan.left_float}
    assert reasons == {
        "net.stem.0": "dynamic quantization has no int8 Conv2d",
        "net.left": "dynamic quantization has no int8 Conv2d",
    }


class ReadsWeights(Model):
    """A forward that uses a layer's weight itself (tied weights do this)."""

    Params = ComponentParams

    def __init__(self, params: ComponentParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.fc = nn.Linear(4, 4)

    def forward(self, inputs: Batch) -> Batch:
        return {"y": nn.functional.linear(self.fc(inputs["x"]), self.fc.weight)}


def test_a_forward_eager_quantization_cannot_follow_is_a_plain_error() -> None:
    from torchloom.deploy.quantize import _check_runs

    model = ReadsWeights(ComponentParams(), BuildContext(name="tied")).eval()
    plan = quantized(model, QuantizeOptions("dynamic"))

    class Graph(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (model({"x": x})["y"],)

    with pytest.raises(DeployError, match="fails on a batch after conversion") as caught:
        _check_runs(Graph(), (torch.randn(3, 4),), plan)  # any module of tensors in and out
    assert "--skip" in caught.value.format() and "tied.fc" in caught.value.format()
