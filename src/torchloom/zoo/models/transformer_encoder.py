"""torch's Transformer encoder as a component: positional encoding, padding mask, pooling."""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field
from torch import nn

from torchloom.core.component import Batch, BuildContext, ComponentParams, Model
from torchloom.core.streams import StreamSpec
from torchloom.zoo.models.self_attention import (
    POOLING_DESCRIPTION,
    Pooling,
    SequencePooling,
    check_heads,
    padding_mask,
    pooled_spec,
    sequence_specs,
)


def sinusoidal_encoding(steps: int, width: int, device: torch.device) -> torch.Tensor:
    """[steps, width]: sin on even features, cos on odd ones, wavelengths 2*pi to
    10000*2*pi (Vaswani et al. 2017); an odd width drops the last cosine."""
    positions = torch.arange(steps, device=device, dtype=torch.float32)[:, None]
    frequencies = torch.exp(
        torch.arange(0, width, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / width)
    )
    angles = positions * frequencies  # [steps, ceil(width / 2)]
    encoding = torch.zeros(steps, width, device=device)
    encoding[:, 0::2] = torch.sin(angles)
    encoding[:, 1::2] = torch.cos(angles[:, : width // 2])
    return encoding


class TransformerEncoderParams(ComponentParams):
    num_heads: int = Field(
        4, gt=0, description="Attention heads per layer (nhead); must divide input_size."
    )
    num_layers: int = Field(2, ge=1, le=64, description="Number of encoder layers.")
    dim_feedforward: int = Field(
        256, gt=0, description="Width of every layer's feed-forward block."
    )
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="Dropout inside every layer.")
    activation: Literal["relu", "gelu"] = Field(
        "relu", description="Non-linearity of the feed-forward blocks."
    )
    norm_first: bool = Field(
        False,
        description="LayerNorm before attention and feed-forward (pre-norm, steadier to train "
        "deep) instead of after (the original post-norm).",
    )
    positional_encoding: Literal["none", "sinusoidal"] = Field(
        "sinusoidal",
        description="Add the fixed sinusoidal position encoding to the inputs (any length); "
        "none for inputs that carry their positions already.",
    )
    use_lengths: bool = Field(
        False,
        description="Read a `lengths` stream: padding is never attended to, never pooled, and "
        "the outputs at padded steps are zeros.",
    )
    pooling: Pooling = Field("none", description=POOLING_DESCRIPTION)


class TransformerEncoder(Model):
    """A stack of Transformer encoder layers (torch.nn.TransformerEncoder, batch-first):
    multi-head self-attention and a feed-forward block per layer, each with residual and
    LayerNorm; the width d_model is the input width. Optional sinusoidal position encoding
    (added to the inputs), padding mask from `lengths`, pooling to one vector per sequence.

    Streams in: `inputs` [batch, -1, input_size] float (e.g. word embeddings); `lengths`
    [batch] int64 with `use_lengths: true`.

    Streams out: `outputs`: [batch, -1, input_size] with `pooling: none` (e.g. for an
    `AttentionDecoder`), [batch, input_size] with `pooling: mean | attention` (for a
    classifier head).

    Globals: needs `input_size` (d_model; num_heads must divide it).

    ```yaml
    pipeline:
      encoder:
        type: TransformerEncoder
        num_heads: 4
        num_layers: 2
        dim_feedforward: 256
        use_lengths: true
        pooling: mean
        streams: {inputs: embeddings, outputs: sentence_vectors}
        globals: {input_size: embeddings_size}
    ```
    """

    Params = TransformerEncoderParams
    params: TransformerEncoderParams
    EXAMPLE_GLOBALS = {"input_size": 64}
    NEEDS_GLOBALS = {"input_size": "width of the input vectors of every step (d_model)"}

    def __init__(self, params: TransformerEncoderParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.input_size = int(self.global_value("input_size"))
        check_heads(self, self.input_size, params.num_heads)
        layer = nn.TransformerEncoderLayer(
            self.input_size,
            params.num_heads,
            dim_feedforward=params.dim_feedforward,
            dropout=params.dropout,
            activation=params.activation,
            batch_first=True,
            norm_first=params.norm_first,
        )
        # No nested tensors: they would drop the padded steps and change the output length
        # (and torch warns about them with norm_first).
        self.encoder = nn.TransformerEncoder(layer, params.num_layers, enable_nested_tensor=False)
        if params.pooling != "none":
            self.pooling = SequencePooling(params.pooling, self.input_size)

    def input_specs(self) -> dict[str, StreamSpec]:
        return sequence_specs(self.input_size, self.params.use_lengths)

    def output_specs(self) -> dict[str, StreamSpec]:
        return {"outputs": pooled_spec(self.input_size, self.params.pooling, "encoded vectors")}

    def forward(self, inputs: Batch) -> Batch:
        sequence = inputs["inputs"]
        steps = sequence.shape[1]
        mask = padding_mask(inputs, self.params.use_lengths, steps, sequence.device)
        if self.params.positional_encoding == "sinusoidal":
            encoding = sinusoidal_encoding(steps, self.input_size, sequence.device)
            sequence = sequence + encoding.to(sequence.dtype)
        encoded = self.encoder(sequence, src_key_padding_mask=None if mask is None else ~mask)
        if mask is not None:
            encoded = encoded * mask[..., None].to(encoded.dtype)
        if self.params.pooling != "none":
            return {"outputs": self.pooling(encoded, mask)}
        return {"outputs": encoded}
