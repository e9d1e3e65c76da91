"""Low-rank, compact and factorized bilinear pooling of two modalities (MLB, MCB, MFB).

Each reads `image_features` [batch, image_features_size] and `question_features` [batch,
question_features_size], sized by the globals of the same names, and writes `outputs` [batch,
output_size], publishing `output_size` for the classifier that follows.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveInt
from torch import nn

from torchloom.core.component import Batch, BuildContext, ComponentParams, Model
from torchloom.core.streams import FLOATING, StreamSpec
from torchloom.zoo.models.fusion import IMAGE_GLOBAL, QUESTION_GLOBAL

_TWO_INPUT_GLOBALS = {
    IMAGE_GLOBAL: "length of the image feature vector of every sample",
    QUESTION_GLOBAL: "length of the question feature vector of every sample",
}
_OUTPUT_GLOBAL = {"output_size": "length of the fused vector of every sample"}
# Keeps the gradient of the signed square root finite at 0 (it is 1 / (2 sqrt(eps)) there).
_SQRT_EPS = 1e-6


def signed_sqrt_l2(values: torch.Tensor) -> torch.Tensor:
    """Power normalisation sign(z) sqrt(|z|), then L2 normalisation of every row (the
    normalisation of MCB and MFB). Shifted by sqrt(eps) so it is continuous at 0 and its
    gradient stays finite there."""
    root = torch.sqrt(values.abs() + _SQRT_EPS) - math.sqrt(_SQRT_EPS)
    return F.normalize(torch.sign(values) * root, p=2.0, dim=1)


# ---- the two-input poolings -------------------------------------------------------------------
class _TwoInputFusion(Model):
    """Shared wiring of the poolings: two vectors in, one fused vector out."""

    NEEDS_GLOBALS = _TWO_INPUT_GLOBALS
    PUBLISHES_GLOBALS = _OUTPUT_GLOBAL
    EXAMPLE_GLOBALS = {IMAGE_GLOBAL: 512, QUESTION_GLOBAL: 256}
    output_size: int

    def __init__(self, params: ComponentParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.image_size = int(self.global_value(IMAGE_GLOBAL))
        self.question_size = int(self.global_value(QUESTION_GLOBAL))

    def input_specs(self) -> dict[str, StreamSpec]:
        return {
            "image_features": StreamSpec(
                ("batch", self.image_size), FLOATING, "image feature vectors"
            ),
            "question_features": StreamSpec(
                ("batch", self.question_size), FLOATING, "question feature vectors"
            ),
        }

    def output_specs(self) -> dict[str, StreamSpec]:
        return {"outputs": StreamSpec(("batch", self.output_size), FLOATING, "fused vectors")}


class LowRankBilinearPoolingParams(ComponentParams):
    latent_size: PositiveInt = Field(
        1200, description="Size of the common space both inputs are projected to (d)."
    )
    output_size: PositiveInt | None = Field(
        None,
        description="Size of a final linear projection P of the product; null: the product "
        "itself (latent_size values) is the output.",
    )
    activation: Literal["tanh", "relu", "none"] = Field(
        "tanh", description="Non-linearity applied to both projections before the product."
    )
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout probability on the product.")


_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "none": nn.Identity,
}


class LowRankBilinearPooling(_TwoInputFusion):
    """Low-rank bilinear pooling by a Hadamard product (Kim et al. 2016, "Hadamard Product
    for Low-rank Bilinear Pooling"): f = P^T (tanh(U^T x) * tanh(V^T y)) + b.

    Projects the image vector x and the question vector y into a common space of
    `latent_size`, applies the activation to both, multiplies them elementwise, applies
    dropout and, when `output_size` is set, a final linear projection. Reads `image_features`
    and `question_features` (sized by the globals `image_features_size` and
    `question_features_size`), writes `outputs` and publishes `output_size`.

    ```yaml
    pipeline:
      fusion:
        type: LowRankBilinearPooling
        latent_size: 512
        dropout: 0.2
        globals: {image_features_size: feature_vector_size, output_size: fused_size}
    ```
    """

    Params = LowRankBilinearPoolingParams
    params: LowRankBilinearPoolingParams

    def __init__(self, params: LowRankBilinearPoolingParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.image_projection = nn.Linear(self.image_size, params.latent_size)
        self.question_projection = nn.Linear(self.question_size, params.latent_size)
        self.activation = _ACTIVATIONS[params.activation]()
        self.dropout = nn.Dropout(params.dropout)
        self.output_projection: nn.Module = (
            nn.Linear(params.latent_size, params.output_size)
            if params.output_size is not None
            else nn.Identity()
        )
        self.output_size = params.output_size or params.latent_size
        self.publish_global("output_size", self.output_size)

    def forward(self, inputs: Batch) -> Batch:
        image = self.activation(self.image_projection(inputs["image_features"]))
        question = self.activation(self.question_projection(inputs["question_features"]))
        return {"outputs": self.output_projection(self.dropout(image * question))}


class CompactBilinearPoolingParams(ComponentParams):
    output_size: PositiveInt = Field(
        16000, description="Size d of the count sketches and of the output (16,000 in the paper)."
    )
    seed: int = Field(
        0, ge=0, description="Seed of the random hashes and signs of the two count sketches."
    )
    normalize: bool = Field(
        True, description="Signed square root, then L2 normalisation of the output."
    )


def count_sketch(
    values: torch.Tensor, hashes: torch.Tensor, signs: torch.Tensor, size: int
) -> torch.Tensor:
    """Count sketch of every row: out[b, hashes[i]] += signs[i] * values[b, i]."""
    out = values.new_zeros(values.shape[0], size)
    return out.index_add(1, hashes, values * signs)


class CompactBilinearPooling(_TwoInputFusion):
    """Multimodal compact bilinear pooling, MCB (Fukui et al. 2016): a count sketch of the
    outer product of the image and question vectors, computed without forming it.

    Each input is count-sketched into `output_size` (d) dimensions with its own random hash
    h: [n] -> [d] and sign s: [n] -> {-1, +1}; the sketch of the outer product x y^T is the
    circular convolution of the two sketches, computed as irfft(rfft(Ψx) · rfft(Ψy)). Its
    inner products estimate those of the outer products without bias:
    E<Ψ(x⊗y), Ψ(x'⊗y')> = <x, x'><y, y'>. Then, by default, signed square root and L2
    normalisation. It has no trainable weights: put a classifier after it. The hashes and
    signs are drawn from `seed` and kept as buffers, so a checkpoint carries them and a
    rebuilt pipeline draws the same ones. The FFT runs in float32 (or float64 for float64
    inputs), also under autocast.

    Reads `image_features` and `question_features` (globals `image_features_size`,
    `question_features_size`), writes `outputs` [batch, output_size] and publishes
    `output_size`.

    ```yaml
    pipeline:
      fusion:
        type: CompactBilinearPooling
        output_size: 8000
        globals: {image_features_size: feature_vector_size, output_size: fused_size}
    ```
    """

    Params = CompactBilinearPoolingParams
    params: CompactBilinearPoolingParams
    image_hashes: torch.Tensor
    image_signs: torch.Tensor
    question_hashes: torch.Tensor
    question_signs: torch.Tensor

    def __init__(self, params: CompactBilinearPoolingParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.output_size = params.output_size
        generator = torch.Generator().manual_seed(params.seed)
        for prefix, length in (("image", self.image_size), ("question", self.question_size)):
            hashes = torch.randint(0, params.output_size, (length,), generator=generator)
            signs = torch.randint(0, 2, (length,), generator=generator).float() * 2 - 1
            self.register_buffer(f"{prefix}_hashes", hashes)
            self.register_buffer(f"{prefix}_signs", signs)
        self.publish_global("output_size", self.output_size)

    def sketches(self, image: torch.Tensor, question: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The count sketches Ψx and Ψy of a batch, in the precision the FFT uses."""
        dtype = torch.float64 if torch.float64 in (image.dtype, question.dtype) else torch.float32
        d = self.params.output_size
        return (
            count_sketch(image.to(dtype), self.image_hashes, self.image_signs.to(dtype), d),
            count_sketch(
                question.to(dtype), self.question_hashes, self.question_signs.to(dtype), d
            ),
        )

    def forward(self, inputs: Batch) -> Batch:
        d = self.params.output_size
        image_sketch, question_sketch = self.sketches(
            inputs["image_features"], inputs["question_features"]
        )
        # Half-precision FFTs need power-of-two sizes and lose precision: stay in float32.
        with torch.autocast(image_sketch.device.type, enabled=False):
            spectrum = torch.fft.rfft(image_sketch, dim=1) * torch.fft.rfft(question_sketch, dim=1)
            outputs = torch.fft.irfft(spectrum, n=d, dim=1)
            if self.params.normalize:
                outputs = signed_sqrt_l2(outputs)
        return {"outputs": outputs}


class FactorizedBilinearPoolingParams(ComponentParams):
    factor: PositiveInt = Field(
        5, description="Factor k: the rank of every output's bilinear form (5 in the paper)."
    )
    output_size: PositiveInt = Field(1000, description="Size o of the output (1000 in the paper).")
    dropout: float = Field(
        0.1, ge=0.0, lt=1.0, description="Dropout probability on the product, before pooling."
    )
    normalize: bool = Field(
        True, description="Power (signed square root), then L2 normalisation of the output."
    )


class FactorizedBilinearPooling(_TwoInputFusion):
    """Multi-modal factorized bilinear pooling, MFB (Yu et al. 2017): every output is a
    bilinear form of rank `factor` in the image and question vectors.

    z = SumPool(Dropout(U^T x * V^T y), k), with U and V projecting to k·o dimensions and the
    sum pooling adding every k consecutive values; then, by default, power normalisation
    (signed square root) and L2 normalisation. Reads `image_features` and
    `question_features` (globals `image_features_size`, `question_features_size`), writes
    `outputs` [batch, output_size] and publishes `output_size`.

    ```yaml
    pipeline:
      fusion:
        type: FactorizedBilinearPooling
        factor: 5
        output_size: 1000
        globals: {image_features_size: feature_vector_size, output_size: fused_size}
    ```
    """

    Params = FactorizedBilinearPoolingParams
    params: FactorizedBilinearPoolingParams

    def __init__(self, params: FactorizedBilinearPoolingParams, context: BuildContext) -> None:
        super().__init__(params, context)
        expanded = params.factor * params.output_size
        self.image_projection = nn.Linear(self.image_size, expanded)
        self.question_projection = nn.Linear(self.question_size, expanded)
        self.dropout = nn.Dropout(params.dropout)
        self.output_size = params.output_size
        self.publish_global("output_size", self.output_size)

    def forward(self, inputs: Batch) -> Batch:
        product = self.image_projection(inputs["image_features"]) * self.question_projection(
            inputs["question_features"]
        )
        product = self.dropout(product)
        pooled = product.view(product.shape[0], self.output_size, self.params.factor).sum(dim=2)
        if self.params.normalize:
            pooled = signed_sqrt_l2(pooled)
        return {"outputs": pooled}
