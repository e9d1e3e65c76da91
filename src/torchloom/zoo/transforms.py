"""Components that change the layout of a stream without learning anything."""

from __future__ import annotations

import math

from pydantic import Field, field_validator

from torchloom.core.component import Batch, BuildContext, Component, ComponentParams
from torchloom.core.streams import DimLike, StreamSpec
from torchloom.errors import ComponentError

BATCH_DIM = -1


class ReshapeTensorParams(ComponentParams):
    input_dims: list[int] = Field(
        ...,
        description="Shape of the input; -1 marks the batch dimension and must come first, "
        "e.g. [-1, 16, 1, 1].",
    )
    output_dims: list[int] = Field(
        ...,
        description="Shape of the output; -1 marks the batch dimension and must come first, "
        "e.g. [-1, 16].",
    )

    @field_validator("input_dims", "output_dims")
    @classmethod
    def _batch_first_and_sizes_positive(cls, dims: list[int]) -> list[int]:
        # The batch size varies (the last batch is smaller), so it is the one free dimension;
        # every other size is fixed so that the handshake can check it.
        if not dims or dims[0] != BATCH_DIM or dims.count(BATCH_DIM) != 1:
            raise ValueError(f"{dims}: -1 (the batch) must appear exactly once, first")
        if any(size < 1 for size in dims[1:]):
            raise ValueError(f"{dims}: the sizes after the batch must be positive")
        return dims


class ReshapeTensor(Component):
    """Reshapes every sample of a tensor stream, keeping the batch dimension and the element
    type: e.g. flattens the [16, 1, 1] feature maps of a `ConvNetEncoder` into vectors of 16
    for a `FeedForwardNetwork`. Publishes `output_size`, the number of elements per sample, for
    the next component to size itself by.

    ```yaml
    pipeline:
      flatten:
        type: ReshapeTensor
        input_dims: [-1, 16, 1, 1]
        output_dims: [-1, 16]
        streams: {inputs: feature_maps, outputs: flat_features}
    ```
    """

    Params = ReshapeTensorParams
    params: ReshapeTensorParams
    PUBLISHES_GLOBALS = {"output_size": "number of elements per sample of the output"}

    def __init__(self, params: ReshapeTensorParams, context: BuildContext) -> None:
        super().__init__(params, context)
        input_count = math.prod(params.input_dims[1:])
        output_count = math.prod(params.output_dims[1:])
        if input_count != output_count:
            raise ComponentError.at(
                context.where(),
                self.label,
                f"input_dims {params.input_dims} hold {input_count} elements per sample "
                f"but output_dims {params.output_dims} hold {output_count}",
                "make the products of the sizes after -1 equal",
            )
        self.publish_global("output_size", output_count)

    def input_specs(self) -> dict[str, StreamSpec]:
        dims: list[DimLike] = ["batch", *self.params.input_dims[1:]]
        return {"inputs": StreamSpec(dims, None, "tensor to reshape")}

    def output_specs(self) -> dict[str, StreamSpec]:
        dims: list[DimLike] = ["batch", *self.params.output_dims[1:]]
        return {"outputs": StreamSpec(dims, None, "the same elements in the new shape")}

    def forward(self, inputs: Batch) -> Batch:
        tensor = inputs["inputs"]
        return {"outputs": tensor.reshape(tensor.shape[0], *self.params.output_dims[1:])}
