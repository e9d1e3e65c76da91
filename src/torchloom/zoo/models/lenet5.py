"""LeNet-5, the classic small convolutional classifier."""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

from torchloom.core.component import Batch, BuildContext, ComponentParams, Model
from torchloom.core.streams import FLOATING, Dim, StreamSpec
from torchloom.errors import ComponentError
from torchloom.zoo.models.image_inputs import (
    CLASSES_GLOBAL,
    IMAGE_EXAMPLE,
    IMAGE_GLOBALS,
    image_size,
)

_KERNEL = 5
_POOL = 2


class LeNet5Params(ComponentParams):
    padding: int = Field(
        2,
        ge=0,
        description="Zero padding of the first convolution; 2 lets 28x28 MNIST images keep "
        "the 32x32 geometry of the original network.",
    )
    dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="Dropout probability before the last linear layer."
    )
    log_softmax: bool = Field(
        True,
        description="End with log_softmax (for NLLLoss); false gives raw logits "
        "(for CrossEntropyLoss).",
    )


def _size_after_features(size: int, padding: int) -> int:
    """Height or width of the feature maps: conv5(padding) -> pool2 -> conv5 -> pool2."""
    size = (size + 2 * padding - _KERNEL + 1) // _POOL
    return (size - _KERNEL + 1) // _POOL


def _minimum_input_size(padding: int) -> int:
    # The last pool needs 2 pixels, so the second conv 6, the first pool 12 outputs, so the
    # first conv 12 outputs, i.e. 16 - 2 * padding inputs.
    return max(1, 16 - 2 * padding)


class LeNet5(Model):
    """LeNet-5 (LeCun et al. 1998) with ReLU and max-pooling, as in most modern re-makes.

    conv 5x5 (6 maps) -> ReLU -> max-pool 2 -> conv 5x5 (16 maps) -> ReLU -> max-pool 2 ->
    linear 120 -> ReLU -> linear 84 -> ReLU -> dropout -> linear `prediction_size` ->
    log_softmax. The size of the flattened features comes from the `input_*` globals, so any
    image of at least 16 - 2 * padding pixels a side works; a smaller one is an error when
    the pipeline is built.

    ```yaml
    pipeline:
      image_classifier:
        type: LeNet5
        dropout: 0.1
        globals: {prediction_size: num_classes}
    ```
    """

    Params = LeNet5Params
    params: LeNet5Params
    EXAMPLE_GLOBALS = {**IMAGE_EXAMPLE, "prediction_size": 10}
    NEEDS_GLOBALS = {**IMAGE_GLOBALS, **CLASSES_GLOBAL}

    def __init__(self, params: LeNet5Params, context: BuildContext) -> None:
        super().__init__(params, context)
        self.input_depth, self.input_height, self.input_width = image_size(self)
        self.prediction_size = int(self.global_value("prediction_size"))

        feature_height = _size_after_features(self.input_height, params.padding)
        feature_width = _size_after_features(self.input_width, params.padding)
        if feature_height < 1 or feature_width < 1:
            minimum = _minimum_input_size(params.padding)
            raise ComponentError.at(
                context.where("globals"),
                self.label,
                f"received images of {self.input_height}x{self.input_width} pixels, "
                f"but needs at least {minimum}x{minimum} with padding {params.padding}",
                "resize the images (e.g. MNIST `resize: [32, 32]`) or raise `padding`",
            )
        self.features = nn.Sequential(
            nn.Conv2d(self.input_depth, 6, _KERNEL, padding=params.padding),
            nn.ReLU(),
            nn.MaxPool2d(_POOL),
            nn.Conv2d(6, 16, _KERNEL),
            nn.ReLU(),
            nn.MaxPool2d(_POOL),
            nn.Flatten(),
        )
        self.classifier = nn.Sequential(
            nn.Linear(16 * feature_height * feature_width, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Dropout(params.dropout),
            nn.Linear(84, self.prediction_size),
        )

    def input_specs(self) -> dict[str, StreamSpec]:
        dims = ("batch", self.input_depth, self.input_height, self.input_width)
        return {"inputs": StreamSpec(dims, FLOATING, "images")}

    def output_specs(self) -> dict[str, StreamSpec]:
        kind = "log-probabilities" if self.params.log_softmax else "logits"
        return {
            "predictions": StreamSpec(
                ("batch", Dim("classes", self.prediction_size)), FLOATING, f"class {kind}"
            )
        }

    def forward(self, inputs: Batch) -> Batch:
        predictions = self.classifier(self.features(inputs["inputs"]))
        if self.params.log_softmax:
            predictions = torch.log_softmax(predictions, dim=1)
        return {"predictions": predictions}
