"""LeNet5, ConvNetEncoder and FeedForwardNetwork: outputs match their specs, gradients reach
every weight, and impossible geometries are build errors that name the culprit."""

from __future__ import annotations

import pydantic
import pytest
import torch
import torch.nn.functional as F

from torchloom.core.component import Component
from torchloom.core.streams import StreamSpec
from torchloom.errors import ComponentError
from torchloom.zoo.models.convnet_encoder import ConvNetEncoder
from torchloom.zoo.models.feed_forward import FeedForwardNetwork
from torchloom.zoo.models.lenet5 import LeNet5


def image_globals(depth: int, height: int, width: int, classes: int = 10) -> dict[str, int]:
    return {
        "input_depth": depth,
        "input_height": height,
        "input_width": width,
        "prediction_size": classes,
    }


def assert_tensor_matches(value: torch.Tensor, spec: StreamSpec, batch_size: int) -> None:
    assert spec.dims is not None and spec.dtypes is not None
    assert value.dtype in spec.dtypes
    expected = [batch_size if dim.name == "batch" else dim.size for dim in spec.dims]
    assert list(value.shape) == expected


def assert_gradients_reach_every_weight(model: Component, output: torch.Tensor) -> None:
    model.zero_grad()
    output.square().mean().backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, name
        assert torch.isfinite(parameter.grad).all(), name
        assert parameter.grad.abs().sum() > 0, name


def run_model(model: Component, inputs: torch.Tensor, output_name: str) -> torch.Tensor:
    assert_tensor_matches(inputs, model.input_specs()["inputs"], inputs.shape[0])
    output = model({"inputs": inputs})[output_name]
    assert_tensor_matches(output, model.output_specs()[output_name], inputs.shape[0])
    return output


@pytest.mark.parametrize(
    ("depth", "size", "padding"), [(1, 28, 2), (3, 32, 0), (1, 12, 2), (1, 16, 0)]
)
def test_lenet5_outputs_log_probabilities_and_learns(depth: int, size: int, padding: int) -> None:
    torch.manual_seed(0)
    model = LeNet5.create(globals=image_globals(depth, size, size), padding=padding)
    predictions = run_model(model, torch.randn(5, depth, size, size), "predictions")
    assert torch.allclose(predictions.exp().sum(dim=1), torch.ones(5), atol=1e-5)
    assert model.output_specs()["predictions"].shape_text() == "[batch, classes=10]"
    assert_gradients_reach_every_weight(model, predictions)


def test_lenet5_logits_and_dropout() -> None:
    model = LeNet5.create(globals=image_globals(1, 28, 28, 7), log_softmax=False, dropout=0.5)
    model.eval()
    inputs = torch.randn(3, 1, 28, 28)
    logits = run_model(model, inputs, "predictions")
    assert not torch.allclose(logits.exp().sum(dim=1), torch.ones(3))
    assert torch.equal(logits, model({"inputs": inputs})["predictions"])  # eval: no dropout


@pytest.mark.parametrize(("size", "padding", "minimum"), [(11, 2, 12), (15, 0, 16)])
def test_lenet5_rejects_images_too_small_to_survive_the_convolutions(
    size: int, padding: int, minimum: int
) -> None:
    with pytest.raises(ComponentError) as error:
        LeNet5.create(name="digits", globals=image_globals(1, size, 20), padding=padding)
    message = str(error.value)
    assert "'digits' (LeNet5)" in message
    assert f"{size}x20" in message
    assert f"at least {minimum}x{minimum}" in message


def test_convnet_encoder_default_layers_publish_the_real_feature_map_size() -> None:
    torch.manual_seed(0)
    encoder = ConvNetEncoder.create(globals=image_globals(1, 28, 28))
    maps = run_model(encoder, torch.randn(4, 1, 28, 28), "feature_maps")
    published = [encoder.global_value(f"feature_map_{key}") for key in ("depth", "height", "width")]
    assert published == list(maps.shape[1:]) == [16, 1, 1]
    assert_gradients_reach_every_weight(encoder, maps)


def test_convnet_encoder_custom_layers() -> None:
    layers = [
        {"out_channels": 8, "kernel_size": 5, "stride": 2, "padding": 2, "pool": 1},
        {"out_channels": 12, "padding": 1},
    ]
    encoder = ConvNetEncoder.create(
        globals=image_globals(3, 32, 20), layers=layers, activation="gelu"
    )
    maps = run_model(encoder, torch.randn(2, 3, 32, 20), "feature_maps")
    assert list(maps.shape) == [2, 12, 8, 5]
    assert encoder.global_value("feature_map_height") == 8
    assert encoder.global_value("feature_map_width") == 5


def test_convnet_encoder_batch_norm_follows_every_activation() -> None:
    torch.manual_seed(0)
    layers = [{"out_channels": 6, "stride": 2, "padding": 1, "pool": 1}] * 2
    encoder = ConvNetEncoder.create(
        globals=image_globals(3, 16, 16), layers=layers, batch_norm=True
    )
    kinds = [type(module).__name__ for module in encoder.layers]
    assert kinds == ["Conv2d", "ReLU", "BatchNorm2d"] * 2
    maps = run_model(encoder, 5 + 3 * torch.randn(8, 3, 16, 16), "feature_maps")
    # in training mode every map comes out standardised over the batch and the cells
    assert torch.allclose(maps.mean(dim=(0, 2, 3)), torch.zeros(6), atol=1e-5)
    assert torch.allclose(maps.var(dim=(0, 2, 3), unbiased=False), torch.ones(6), atol=1e-2)
    assert_gradients_reach_every_weight(encoder, maps)


def test_convnet_encoder_names_the_layer_where_the_maps_collapse() -> None:
    layers = [{"out_channels": 4}] * 5  # 28 -> 13 -> 5 -> 1 -> the fourth conv has no room
    with pytest.raises(ComponentError) as error:
        ConvNetEncoder.create(name="encoder", globals=image_globals(1, 28, 28), layers=layers)
    message = str(error.value)
    assert "'encoder' (ConvNetEncoder)" in message
    assert "layers[3]" in message
    assert "1x1" in message


def test_convnet_encoder_layer_keys_are_checked() -> None:
    with pytest.raises(pydantic.ValidationError, match="kernal_size"):
        ConvNetEncoder.create(
            globals=image_globals(1, 28, 28), layers=[{"out_channels": 4, "kernal_size": 3}]
        )


@pytest.mark.parametrize("activation", ["relu", "tanh", "sigmoid", "gelu"])
def test_feed_forward_network(activation: str) -> None:
    torch.manual_seed(0)
    network = FeedForwardNetwork.create(
        globals={"input_size": 20, "prediction_size": 4},
        hidden_sizes=[16, 8],
        activation=activation,
        dropout=0.1,
    )
    predictions = run_model(network, torch.randn(6, 20), "predictions")
    assert torch.allclose(predictions.exp().sum(dim=1), torch.ones(6), atol=1e-5)
    assert_gradients_reach_every_weight(network, predictions)


def test_feed_forward_network_without_hidden_layers_is_one_linear_layer() -> None:
    network = FeedForwardNetwork.create(
        globals={"input_size": 5, "prediction_size": 3}, log_softmax=False
    )
    inputs = torch.randn(2, 5)
    linear = network.layers[0]
    assert isinstance(linear, torch.nn.Linear) and len(network.layers) == 1
    outputs = run_model(network, inputs, "predictions")
    assert torch.allclose(outputs, F.linear(inputs, linear.weight, linear.bias))
