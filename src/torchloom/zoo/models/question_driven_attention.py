"""Attention over image features, driven by a question: where to look, for this question."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveInt
from torch import nn

from torchloom.core.component import Batch, BuildContext, ComponentParams, Model
from torchloom.core.streams import FLOATING, DimLike, StreamSpec

IMAGE_GLOBAL = "image_features_size"
QUESTION_GLOBAL = "question_features_size"


class QuestionDrivenAttentionParams(ComponentParams):
    heads: PositiveInt = Field(
        2, description="Number of attention heads (glimpses), each with its own attention map."
    )
    latent_size: PositiveInt = Field(
        512, description="Size of the space where image and question features are combined."
    )
    image_layout: Literal["maps", "regions"] = Field(
        "maps",
        description="'maps': image features are feature maps [batch, C, H, W] (a CNN's); "
        "'regions': a set of vectors [batch, N, C] (object or patch features).",
    )
    output_mode: Literal["image", "fused"] = Field(
        "image",
        description="'image': the attended image vectors of all heads, concatenated; 'fused': "
        "those followed by the question vector.",
    )
    normalize_image: bool = Field(
        True,
        description="L2-normalise the image feature vector of every location first "
        "(Kazemi and Elqursh 2017).",
    )
    dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="Dropout probability on both inputs of the attention."
    )
    attention_maps: bool = Field(
        False,
        description="Also write the attention weights as the `attention` stream (for viewers).",
    )


class QuestionDrivenAttention(Model):
    """Multi-head attention over the locations of an image, driven by a question vector
    ("Show, Ask, Attend, and Answer", Kazemi and Elqursh 2017; the attention of Yang et al.'s
    stacked attention networks).

    Every location's feature vector v_i (optionally L2-normalised) and the question vector q
    are projected to `latent_size`, added, passed through ReLU, and scored by one linear layer
    per head: a_h = softmax_i(w_h · relu(W v_i + U q + b)). Each head outputs the weighted sum
    Σ_i a_h,i v_i; `outputs` is the heads' vectors concatenated, [batch, heads · C], or, with
    `output_mode: fused`, that followed by q, [batch, heads · C + Q]. The attention weights
    can be written too (`attention_maps: true`), [batch, heads, H, W] for maps and
    [batch, heads, N] for regions. The number of locations is free: any H, W or N works.

    Reads `image_features` ([batch, C, H, W], or [batch, N, C] with
    `image_layout: regions`) and `question_features` [batch, Q]; C and Q are the globals
    `image_features_size` and `question_features_size` (map them to e.g. a `ConvNetEncoder`'s
    `feature_map_depth`). Publishes `output_size`.

    ```yaml
    pipeline:
      attention:
        type: QuestionDrivenAttention
        heads: 2
        latent_size: 256
        output_mode: fused
        streams: {image_features: feature_maps, question_features: question_vectors}
        globals:
          image_features_size: feature_map_depth
          question_features_size: question_vector_size
          output_size: attended_size
    ```
    """

    Params = QuestionDrivenAttentionParams
    params: QuestionDrivenAttentionParams
    EXAMPLE_GLOBALS = {IMAGE_GLOBAL: 512, QUESTION_GLOBAL: 256}
    NEEDS_GLOBALS = {
        IMAGE_GLOBAL: "channels C of the image features (length of every location's vector)",
        QUESTION_GLOBAL: "length Q of the question feature vector",
    }
    PUBLISHES_GLOBALS = {"output_size": "length of the output vector of every sample"}

    def __init__(self, params: QuestionDrivenAttentionParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.image_size = int(self.global_value(IMAGE_GLOBAL))
        self.question_size = int(self.global_value(QUESTION_GLOBAL))
        # The question's bias serves both projections, so the image one needs none.
        self.image_projection = nn.Linear(self.image_size, params.latent_size, bias=False)
        self.question_projection = nn.Linear(self.question_size, params.latent_size)
        self.scores = nn.Linear(params.latent_size, params.heads)
        self.dropout = nn.Dropout(params.dropout)
        self.output_size = params.heads * self.image_size
        if params.output_mode == "fused":
            self.output_size += self.question_size
        self.publish_global("output_size", self.output_size)

    def _location_dims(self) -> tuple[DimLike, ...]:
        return (-1, -1) if self.params.image_layout == "maps" else (-1,)

    def input_specs(self) -> dict[str, StreamSpec]:
        if self.params.image_layout == "maps":
            image_dims: tuple[DimLike, ...] = ("batch", self.image_size, -1, -1)
            kind = "image feature maps"
        else:
            image_dims = ("batch", -1, self.image_size)
            kind = "feature vectors of the image's regions"
        return {
            "image_features": StreamSpec(image_dims, FLOATING, kind),
            "question_features": StreamSpec(
                ("batch", self.question_size), FLOATING, "question feature vectors"
            ),
        }

    def output_specs(self) -> dict[str, StreamSpec]:
        kind = "attended image vectors of every head"
        if self.params.output_mode == "fused":
            kind += ", then the question vector"
        specs = {"outputs": StreamSpec(("batch", self.output_size), FLOATING, kind)}
        if self.params.attention_maps:
            dims = ("batch", self.params.heads, *self._location_dims())
            specs["attention"] = StreamSpec(
                dims, FLOATING, "attention weights of every head (sum to 1 over the locations)"
            )
        return specs

    def forward(self, inputs: Batch) -> Batch:
        image = inputs["image_features"]
        question = inputs["question_features"]
        maps = self.params.image_layout == "maps"
        regions = image.flatten(2).transpose(1, 2) if maps else image  # [batch, N, C]
        if self.params.normalize_image:
            regions = F.normalize(regions, p=2.0, dim=2)
        latent = self.image_projection(self.dropout(regions)) + self.question_projection(
            self.dropout(question)
        ).unsqueeze(1)
        weights = torch.softmax(self.scores(torch.relu(latent)), dim=1)  # [batch, N, heads]
        attended = torch.bmm(weights.transpose(1, 2), regions)  # [batch, heads, C]
        outputs = attended.flatten(1)
        if self.params.output_mode == "fused":
            outputs = torch.cat([outputs, question.to(outputs.dtype)], dim=1)
        result: dict[str, torch.Tensor] = {"outputs": outputs}
        if self.params.attention_maps:
            attention = weights.transpose(1, 2)  # [batch, heads, N]
            if maps:
                attention = attention.reshape(*attention.shape[:2], *image.shape[2:])
            result["attention"] = attention
        return result
