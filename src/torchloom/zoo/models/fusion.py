"""Fusion of two modalities by concatenation (`Concatenation`: any number of streams, by default
`image_features` and `question_features`); the bilinear poolings are in bilinear_pooling.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from pydantic import Field, PositiveInt, field_validator

from torchloom.core.component import Batch, BuildContext, ComponentParams, Model
from torchloom.core.streams import FLOATING, DimLike, StreamSpec
from torchloom.errors import ComponentError, Problem

IMAGE_GLOBAL = "image_features_size"
QUESTION_GLOBAL = "question_features_size"


# ---- Concatenation ----------------------------------------------------------------------------
class ConcatenationParams(ComponentParams):
    input_streams: list[str] = Field(
        default_factory=lambda: ["image_features", "question_features"],
        min_length=2,
        description="Streams to concatenate, in order (default names; `streams:` renames them).",
    )
    input_dims: list[list[PositiveInt]] | None = Field(
        None,
        description="Shape of every sample of each input, without the batch, e.g. "
        "[[16, 7, 7], [8, 7, 7]]; null: every input is a vector whose length is the global "
        "`<stream>_size` (e.g. `image_features_size`).",
    )
    dim: int = Field(
        -1,
        description="Dimension to concatenate along, counting the batch as 0 (so 1 is the first "
        "feature dimension); negative counts from the end. The batch itself cannot be it.",
    )

    @field_validator("input_streams")
    @classmethod
    def _distinct(cls, names: list[str]) -> list[str]:
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"every stream must appear once; repeated: {', '.join(repeated)}")
        return names


class Concatenation(Model):
    """Concatenates several tensor streams along one dimension: the simplest fusion of image
    and question features (as in CLEVR's CNN+LSTM baseline), or of any other encodings.

    Reads the streams listed in `input_streams` (default `image_features` and
    `question_features`) and writes `outputs`. By default every input is a vector
    [batch, size] whose size is the global `<stream>_size` (`image_features_size`,
    `question_features_size`); `input_dims` gives full per-sample shapes instead (e.g. feature
    maps concatenated along the channels with `dim: 1`). The sizes of all other dimensions
    must agree, which is checked when the pipeline is built. Publishes `output_size`, the size
    of the concatenated dimension (for vectors, the length of the output vector). It has no
    weights.

    ```yaml
    pipeline:
      fusion:
        type: Concatenation
        input_streams: [image_features, question_features]
        streams: {outputs: fused_features}
        globals: {image_features_size: feature_vector_size, output_size: fused_size}
    ```
    """

    Params = ConcatenationParams
    params: ConcatenationParams
    EXAMPLE_GLOBALS = {IMAGE_GLOBAL: 512, QUESTION_GLOBAL: 256}
    PUBLISHES_GLOBALS = {"output_size": "size of the concatenated dimension of the output"}

    @classmethod
    def needed_globals(cls, params: ComponentParams) -> Mapping[str, str]:
        assert isinstance(params, ConcatenationParams)
        if params.input_dims is not None:
            return {}
        return {f"{name}_size": f"length of the '{name}' vectors" for name in params.input_streams}

    def __init__(self, params: ConcatenationParams, context: BuildContext) -> None:
        super().__init__(params, context)
        if params.input_dims is None:
            shapes = [[int(self.global_value(f"{n}_size"))] for n in params.input_streams]
        else:
            shapes = [list(dims) for dims in params.input_dims]
        self.input_shapes = shapes
        self.axis = self._check_shapes(shapes)  # per-sample axis: full dim - 1
        self.output_shape = list(shapes[0])
        self.output_shape[self.axis] = sum(shape[self.axis] for shape in shapes)
        self.publish_global("output_size", self.output_shape[self.axis])

    def _fail(self, key: str, message: str, suggestion: str = "") -> ComponentError:
        return ComponentError([Problem(self.where(key), self.label, message, suggestion)])

    def _check_shapes(self, shapes: list[list[int]]) -> int:
        p = self.params
        if len(shapes) != len(p.input_streams):
            raise self._fail(
                "input_dims",
                f"gives {len(shapes)} shapes for {len(p.input_streams)} input streams",
                "give one shape per stream of `input_streams`, in the same order",
            )
        rank = len(shapes[0]) + 1  # with the batch
        if any(len(shape) + 1 != rank for shape in shapes):
            raise self._fail("input_dims", f"the inputs have different ranks: {shapes}")
        full_dim = p.dim if p.dim >= 0 else rank + p.dim
        if not 1 <= full_dim < rank:
            raise self._fail(
                "dim",
                f"dim {p.dim} is not a feature dimension of inputs of rank {rank}",
                f"use 1 to {rank - 1} (or -1 to {1 - rank}); 0 is the batch",
            )
        axis = full_dim - 1
        reference = [s for i, s in enumerate(shapes[0]) if i != axis]
        for name, shape in zip(p.input_streams, shapes, strict=True):
            if [s for i, s in enumerate(shape) if i != axis] != reference:
                raise self._fail(
                    "input_dims",
                    f"'{name}' has shape {shape} but '{p.input_streams[0]}' {shapes[0]}: only "
                    f"dimension {full_dim} (the one concatenated) may differ",
                    "check `input_dims` and `dim`",
                )
        return axis

    def input_specs(self) -> dict[str, StreamSpec]:
        return {
            name: StreamSpec(("batch", *shape), FLOATING, f"input {index + 1} to concatenate")
            for index, (name, shape) in enumerate(
                zip(self.params.input_streams, self.input_shapes, strict=True)
            )
        }

    def output_specs(self) -> dict[str, StreamSpec]:
        dims: list[DimLike] = ["batch", *self.output_shape]
        return {"outputs": StreamSpec(dims, FLOATING, "the inputs, concatenated")}

    def forward(self, inputs: Batch) -> Batch:
        tensors = [inputs[name] for name in self.params.input_streams]
        return {"outputs": torch.cat(tensors, dim=self.axis + 1)}
