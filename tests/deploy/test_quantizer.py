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
    torch.manual_seed(0)  # weights and batches alike: the tolerance below holds for these
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


class ResidualStack(Model):
    """torchvision residual blocks in a Sequential, as GenericImageEncoder's ResNet backbone:
    a stem, two basic blocks (the second downsampling) and a bottleneck."""

    Params = ComponentParams

    def __init__(self, params: ComponentParams, context: BuildContext) -> None:
        from torchvision.models.resnet import BasicBlock, Bottleneck

        super().__init__(params, context)

        def downsample(inputs: int, outputs: int, stride: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride=stride, bias=False), nn.BatchNorm2d(outputs)
            )

        self.backbone = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(inplace=True),
            nn.Sequential(BasicBlock(8, 8), BasicBlock(8, 16, 2, downsample(8, 16, 2))),
            Bottleneck(16, 4, downsample=downsample(16, 16, 1)),
        )

    def forward(self, inputs: Batch) -> Batch:
        return {"y": self.backbone(inputs["x"]).mean(dim=(2, 3))}


def residual_stack() -> Model:
    torch.manual_seed(0)
    model = ResidualStack(ComponentParams(), BuildContext(name="resnet"))
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.2, 0.2)
                module.running_var.uniform_(0.5, 2.0)
    return model.eval()


@pytest.mark.parametrize("mode", ["static", "qat"])
def test_residual_blocks_are_fused_and_quantized_whole(mode: str) -> None:
    from torch.ao.nn.quantized import QFunctional

    model, x = residual_stack(), torch.randn(8, 1, 8, 8)
    with torch.no_grad():
        expected = model({"x": x})["y"]
    plan = quantized(model, QuantizeOptions(mode), {"x": torch.randn(16, 1, 8, 8)})
    assert len(plan.layers) == 10 and all(layer.quantized for layer in plan.layers)
    kinds = {type(m).__name__ for m in model.modules()}
    # Every batch norm folded into its conv; each block's residual add and ReLU one int8 op.
    assert "BatchNorm2d" not in kinds and {"ConvReLU2d", "Conv2d"} <= kinds
    assert sum(isinstance(m, QFunctional) for m in model.modules()) == 3
    # One int8 chain from the stem to the bottleneck: one quant and one dequant stub.
    assert [type(m).__name__ for m in model.modules()].count("Quantize") == 1
    with torch.no_grad(), quantized_engine("x86"):
        got = model({"x": x})["y"]
    if mode == "static":
        assert (got - expected).abs().max() < 0.1 * expected.abs().max()
    # A fresh copy prepared and converted the same way takes the int8 state dict (what a
    # quantized folder's reload does).
    again = residual_stack()
    quantizer = choose_quantizer(QuantizeOptions(mode))
    with quantized_engine("x86"):
        quantizer.prepare(again, Plan())
        quantizer.convert(again)
        again.load_state_dict(model.state_dict())
        with torch.no_grad():
            assert torch.equal(again({"x": x})["y"], got)


def test_a_skipped_layer_inside_a_residual_block_leaves_the_block_to_its_layers() -> None:
    model = residual_stack()
    plan = quantized(model, QuantizeOptions("static", skip=("resnet.backbone.3.0.conv2",)), None)
    outcomes = {layer.name: layer for layer in plan.layers}
    assert not outcomes["resnet.backbone.3.0.conv2"].quantized
    assert outcomes["resnet.backbone.3.0.conv1"].quantized  # alone, between stubs
    assert outcomes["resnet.backbone.4.conv3"].quantized  # the other blocks stay whole
    assert isinstance(model.backbone[3][0].conv2, nn.Conv2d)


def test_dynamic_converts_each_component_with_its_own_layers() -> None:
    """Every component is prepared before any is converted (`loom quantize` does so): each
    conversion uses what was chosen in that component, not in the last one prepared."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    first, second = residual(), ReadsWeights(ComponentParams(), BuildContext(name="other"))
    quantizer = choose_quantizer(QuantizeOptions("dynamic"))
    plan = Plan()
    with quantized_engine("x86"):
        quantizer.prepare(first, plan)
        quantizer.prepare(second, plan)
        quantizer.convert(first)
        quantizer.convert(second)
    assert isinstance(first.head[1], DynamicLinear) and isinstance(second.fc, DynamicLinear)


def test_qat_activation_ranges_move_with_training_batches_only() -> None:
    """Validation and test passes of the fine-tuning (eval mode) leave the activations'
    ranges as training made them: the converted scales owe nothing to evaluation data."""
    model = residual()
    quantizer = choose_quantizer(QuantizeOptions("qat"))
    with quantized_engine("x86"):
        quantizer.prepare(model, Plan())
    observers = {
        name: module
        for name, module in model.named_modules()
        if name.endswith("activation_post_process")
        and isinstance(module, torch.ao.quantization.FakeQuantizeBase)
    }
    assert observers

    def ranges() -> dict[str, tuple[float, float]]:
        found = {}
        for name, module in observers.items():
            observer = module.activation_post_process
            found[name] = (float(observer.min_val), float(observer.max_val))
        return found

    model.train()
    model({"x": torch.randn(8, 1, 8, 8)})
    trained = ranges()
    model.eval()
    with torch.no_grad():
        model({"x": 100 * torch.randn(8, 1, 8, 8)})
    assert ranges() == trained
    model.train()
    model({"x": 100 * torch.randn(8, 1, 8, 8)})
    assert ranges() != trained


class TwoChains(Model):
    """Two Sequential chains: `direct` passes the first's output straight to the second (as
    LeNet-5's forward does); otherwise a float op on it comes between and it is returned too."""

    Params = ComponentParams

    def __init__(self, params: ComponentParams, context: BuildContext, direct: bool) -> None:
        super().__init__(params, context)
        self.direct = direct
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten())
        self.classifier = nn.Sequential(nn.Linear(4 * 8 * 8, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, inputs: Batch) -> Batch:
        features = self.features(inputs["x"])
        if self.direct:
            return {"y": torch.log_softmax(self.classifier(features), dim=1)}
        return {"y": self.classifier(features * 0.5), "features": features}


def _stubs(model: nn.Module) -> list[str]:
    return [
        type(m).__name__ for m in model.modules() if type(m).__name__ in ("Quantize", "DeQuantize")
    ]


@pytest.mark.parametrize("mode", ["static", "qat"])
def test_chains_one_forward_passes_on_directly_stay_int8_between(mode: str) -> None:
    torch.manual_seed(0)
    model = TwoChains(ComponentParams(), BuildContext(name="net"), direct=True).eval()
    x = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        expected = model({"x": x})["y"]
    quantized(model, QuantizeOptions(mode))
    # One quantize at the start, one dequantize at the end: no float round trip between the
    # chains, whose layers keep the float model's places (and state-dict keys).
    assert _stubs(model) == ["Quantize", "DeQuantize"]
    assert type(model.features[2]) is nn.Flatten
    assert type(model.classifier[0]).__name__ == "LinearReLU"
    with torch.no_grad(), quantized_engine("x86"):
        got = model({"x": x})["y"]
    assert (got.exp() - expected.exp()).abs().max() < 0.1


def test_chains_with_float_work_between_keep_their_stubs() -> None:
    torch.manual_seed(0)
    model = TwoChains(ComponentParams(), BuildContext(name="net"), direct=False).eval()
    x = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        expected = model({"x": x})["y"]
    quantized(model, QuantizeOptions("static"))
    assert _stubs(model) == ["Quantize", "DeQuantize", "Quantize", "DeQuantize"]
    with torch.no_grad(), quantized_engine("x86"):
        got = model({"x": x})
    assert got["features"].dtype == torch.float32
    assert (got["y"] - expected).abs().max() < 0.1 * expected.abs().max() + 0.05
