"""A multi-layer perceptron: the usual classifier head on top of an encoder."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, PositiveInt
from torch import nn

from torchloom.core.component import Batch, BuildContext, ComponentParams, Model
from torchloom.core.streams import FLOATING, Dim, StreamSpec

_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "gelu": nn.GELU,
}


class FeedForwardNetworkParams(ComponentParams):
    hidden_sizes: list[PositiveInt] = Field(
        default_factory=list,
        description="Sizes of the hidden layers, first to last; [] is a single linear layer.",
    )
    activation: Literal["relu", "tanh", "sigmoid", "gelu"] = Field(
        "relu", description="Non-linearity after every hidden layer."
    )
    dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="Dropout probability after every hidden layer."
    )
    log_softmax: bool = Field(
        True,
        description="End with log_softmax (for NLLLoss); false gives raw outputs "
        "(logits for CrossEntropyLoss, or values for regression).",
    )


class FeedForwardNetwork(Model):
    """Fully connected layers: linear -> activation -> dropout for every hidden size, then a
    linear layer to `prediction_size` outputs and, by default, log_softmax.

    Its input is a flat vector per sample; put a `ReshapeTensor` in front of it to flatten
    feature maps, and map its `input_size` global to the reshaper's `output_size`.

    ```yaml
    pipeline:
      classifier:
        type: FeedForwardNetwork
        hidden_sizes: [128, 64]
        dropout: 0.2
        streams: {inputs: flat_features}
        globals: {input_size: output_size, prediction_size: num_classes}
    ```
    """

    Params = FeedForwardNetworkParams
    params: FeedForwardNetworkParams
    EXAMPLE_GLOBALS = {"input_size": 784, "prediction_size": 10}
    NEEDS_GLOBALS = {
        "input_size": "number of input features per sample",
        "prediction_size": "number of outputs, usually the number of classes",
    }

    def __init__(self, params: FeedForwardNetworkParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.input_size = int(self.global_value("input_size"))
        self.prediction_size = int(self.global_value("prediction_size"))

        layers: list[nn.Module] = []
        width = self.input_size
        for hidden_size in params.hidden_sizes:
            layers += [nn.Linear(width, hidden_size), _ACTIVATIONS[params.activation]()]
            if params.dropout > 0:
                layers.append(nn.Dropout(params.dropout))
            width = hidden_size
        layers.append(nn.Linear(width, self.prediction_size))
        self.layers = nn.Sequential(*layers)

    def input_specs(self) -> dict[str, StreamSpec]:
        return {"inputs": StreamSpec(("batch", self.input_size), FLOATING, "feature vectors")}

    def output_specs(self) -> dict[str, StreamSpec]:
        kind = "class log-probabilities" if self.params.log_softmax else "outputs"
        return {
            "predictions": StreamSpec(
                ("batch", Dim("classes", self.prediction_size)), FLOATING, kind
            )
        }

    def forward(self, inputs: Batch) -> Batch:
        predictions = self.layers(inputs["inputs"])
        if self.params.log_softmax:
            predictions = torch.log_softmax(predictions, dim=1)
        return {"predictions": predictions}
