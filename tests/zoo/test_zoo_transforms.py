"""ReshapeTensor: reshapes per sample, publishes output_size, rejects impossible shapes."""

from __future__ import annotations

import pydantic
import pytest
import torch

from torchloom.errors import ComponentError
from torchloom.zoo.models.convnet_encoder import ConvNetEncoder
from torchloom.zoo.models.feed_forward import FeedForwardNetwork
from torchloom.zoo.transforms import ReshapeTensor


def test_flattens_each_sample_and_publishes_the_output_size() -> None:
    reshape = ReshapeTensor.create(input_dims=[-1, 16, 2, 3], output_dims=[-1, 96])
    inputs = torch.arange(4 * 96, dtype=torch.float32).reshape(4, 16, 2, 3)
    outputs = reshape({"inputs": inputs})["outputs"]
    assert torch.equal(outputs, inputs.flatten(1))
    assert reshape.global_value("output_size") == 96
    assert reshape.input_specs()["inputs"].shape_text() == "[batch, 16, 2, 3]"
    assert reshape.output_specs()["outputs"].shape_text() == "[batch, 96]"


def test_an_empty_batch_keeps_its_shape() -> None:
    reshape = ReshapeTensor.create(input_dims=[-1, 6], output_dims=[-1, 2, 3])
    assert reshape({"inputs": torch.zeros(0, 6)})["outputs"].shape == (0, 2, 3)


def test_element_count_mismatch_names_both_lists() -> None:
    with pytest.raises(ComponentError) as error:
        ReshapeTensor.create(name="flatten", input_dims=[-1, 16, 2, 2], output_dims=[-1, 60])
    message = str(error.value)
    assert "'flatten' (ReshapeTensor)" in message
    assert "[-1, 16, 2, 2]" in message and "64" in message
    assert "[-1, 60]" in message and "60" in message


@pytest.mark.parametrize("dims", [[16, -1], [-1, 4, -1], [4, 4], [], [-1, 0]])
def test_the_batch_must_come_first_exactly_once(dims: list[int]) -> None:
    with pytest.raises(pydantic.ValidationError) as error:
        ReshapeTensor.create(input_dims=dims, output_dims=[-1, 16])
    assert "input_dims" in str(error.value)


def test_joins_an_encoder_to_a_classifier_through_published_globals() -> None:
    torch.manual_seed(0)
    image = {"input_depth": 1, "input_height": 28, "input_width": 28}
    encoder = ConvNetEncoder.create(globals=image)
    sizes = [encoder.global_value(f"feature_map_{k}") for k in ("depth", "height", "width")]
    flatten = ReshapeTensor.create(input_dims=[-1, *sizes], output_dims=[-1, sizes[0] * 1 * 1])
    classifier = FeedForwardNetwork.create(
        globals={"input_size": flatten.global_value("output_size"), "prediction_size": 10},
        hidden_sizes=[32],
    )
    maps = encoder({"inputs": torch.randn(3, 1, 28, 28)})["feature_maps"]
    flat = flatten({"inputs": maps})["outputs"]
    predictions = classifier({"inputs": flat})["predictions"]
    assert predictions.shape == (3, 10)
    predictions.sum().backward()
    assert all(p.grad is not None for p in encoder.parameters())
