"""A configurable stack of convolutions that turns images into feature maps."""

from __future__ import annotations

from typing import Literal, NoReturn

from pydantic import ConfigDict, Field
from torch import nn

from torchloom.config_model import ConfigModel
from torchloom.core.component import Batch, BuildContext, ComponentParams, Model
from torchloom.core.streams import FLOATING, StreamSpec
from torchloom.errors import ComponentError
from torchloom.zoo.models.image_inputs import IMAGE_EXAMPLE, IMAGE_GLOBALS, image_size

_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "leaky_relu": nn.LeakyReLU,
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
}


class ConvLayer(ConfigModel):
    """One convolution, followed by the activation and an optional max-pooling."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    out_channels: int = Field(..., gt=0, description="Number of feature maps it produces.")
    kernel_size: int = Field(3, gt=0, description="Side of the square convolution kernel.")
    stride: int = Field(1, gt=0, description="Stride of the convolution.")
    padding: int = Field(0, ge=0, description="Zero padding on every side.")
    pool: int = Field(2, ge=1, description="Kernel (and stride) of the max-pooling; 1 = none.")


def _default_layers() -> list[ConvLayer]:
    # PyTorchPipe's ConvNetEncoder: three 3x3 convolutions of 64, 32 and 16 maps, each pooled.
    return [ConvLayer(out_channels=channels) for channels in (64, 32, 16)]


class ConvNetEncoderParams(ComponentParams):
    layers: list[ConvLayer] = Field(
        default_factory=_default_layers,
        min_length=1,
        description="The convolutions, first to last: each is {out_channels, kernel_size: 3, "
        "stride: 1, padding: 0, pool: 2}.",
    )
    activation: Literal["relu", "leaky_relu", "tanh", "gelu"] = Field(
        "relu", description="Non-linearity after every convolution."
    )
    batch_norm: bool = Field(
        False,
        description="Batch-normalise every layer's maps after its activation (before its "
        "pooling), as the CNN of the Relation Network paper does (Santoro et al. 2017).",
    )


class ConvNetEncoder(Model):
    """A stack of convolution -> activation -> max-pool layers, the image encoder of
    PyTorchPipe's MNIST and CIFAR pipelines; with `batch_norm`, convolution -> activation ->
    batch norm -> max-pool.

    It publishes the size of its feature maps as globals, so what comes after it (a
    `ReshapeTensor` then a `FeedForwardNetwork`, say) is sized without arithmetic in the
    config. A layer whose output would be smaller than one pixel is an error when the
    pipeline is built, naming the layer.

    ```yaml
    pipeline:
      image_encoder:
        type: ConvNetEncoder
        layers:
          - {out_channels: 32, kernel_size: 3, padding: 1}
          - {out_channels: 64, kernel_size: 3, padding: 1, pool: 2}
    ```
    """

    Params = ConvNetEncoderParams
    params: ConvNetEncoderParams
    EXAMPLE_GLOBALS = IMAGE_EXAMPLE
    NEEDS_GLOBALS = IMAGE_GLOBALS
    PUBLISHES_GLOBALS = {
        "feature_map_depth": "number of feature maps the encoder produces",
        "feature_map_height": "height of the feature maps",
        "feature_map_width": "width of the feature maps",
    }

    def __init__(self, params: ConvNetEncoderParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.input_depth, self.input_height, self.input_width = image_size(self)

        modules: list[nn.Module] = []
        depth, height, width = self.input_depth, self.input_height, self.input_width
        for index, layer in enumerate(params.layers):
            modules.append(
                nn.Conv2d(depth, layer.out_channels, layer.kernel_size, layer.stride, layer.padding)
            )
            modules.append(_ACTIVATIONS[params.activation]())
            if params.batch_norm:
                modules.append(nn.BatchNorm2d(layer.out_channels))
            depth = layer.out_channels
            height, width = self._conv_output(index, layer, height, width)
            if layer.pool > 1:
                modules.append(nn.MaxPool2d(layer.pool))
                height, width = self._pool_output(index, layer, height, width)
        self.layers = nn.Sequential(*modules)
        self.feature_map_depth = depth
        self.feature_map_height = height
        self.feature_map_width = width
        self.publish_global("feature_map_depth", depth)
        self.publish_global("feature_map_height", height)
        self.publish_global("feature_map_width", width)

    def _conv_output(
        self, index: int, layer: ConvLayer, height: int, width: int
    ) -> tuple[int, int]:
        def out(size: int) -> int:
            return (size + 2 * layer.padding - layer.kernel_size) // layer.stride + 1

        new_height, new_width = out(height), out(width)
        if new_height < 1 or new_width < 1:
            self._collapsed(
                index, f"its {layer.kernel_size}x{layer.kernel_size} convolution", height, width
            )
        return new_height, new_width

    def _pool_output(
        self, index: int, layer: ConvLayer, height: int, width: int
    ) -> tuple[int, int]:
        new_height, new_width = height // layer.pool, width // layer.pool
        if new_height < 1 or new_width < 1:
            self._collapsed(index, f"its max-pooling of {layer.pool}", height, width)
        return new_height, new_width

    def _collapsed(self, index: int, step: str, height: int, width: int) -> NoReturn:
        raise ComponentError.at(
            self._context.where("layers"),
            self.label,
            f"layers[{index}] receives maps of {height}x{width}, too small for {step}: "
            f"its output would be less than one pixel",
            "use larger images, padding, smaller kernels or less pooling, or fewer layers",
        )

    def input_specs(self) -> dict[str, StreamSpec]:
        dims = ("batch", self.input_depth, self.input_height, self.input_width)
        return {"inputs": StreamSpec(dims, FLOATING, "images")}

    def output_specs(self) -> dict[str, StreamSpec]:
        dims = ("batch", self.feature_map_depth, self.feature_map_height, self.feature_map_width)
        return {"feature_maps": StreamSpec(dims, FLOATING, "feature maps of the last layer")}

    def forward(self, inputs: Batch) -> Batch:
        return {"feature_maps": self.layers(inputs["inputs"])}
