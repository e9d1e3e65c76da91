"""Multi-head self-attention over a sequence, with optional padding mask and pooling; the
pooling is shared with `TransformerEncoder`."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import nn

from torchloom.core.component import Batch, BuildContext, Component, ComponentParams, Model
from torchloom.core.streams import FLOATING, StreamSpec
from torchloom.errors import ComponentError
from torchloom.zoo.models.recurrent import checked_lengths, length_mask

Pooling = Literal["none", "mean", "attention"]
POOLING_DESCRIPTION = (
    "none: the attended sequence [batch, -1, input_size]; mean: its mean over each sequence's "
    "valid steps, [batch, input_size]; attention: a learnt weighted sum of the steps (a "
    "linear score per step, softmax over the valid steps), [batch, input_size]."
)


class SequencePooling(nn.Module):
    """[batch, steps, width] -> [batch, width] over the valid steps only (mask True)."""

    def __init__(self, mode: Pooling, width: int) -> None:
        super().__init__()
        self.mode = mode
        if mode == "attention":
            self.score = nn.Linear(width, 1)

    def forward(self, sequence: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if self.mode == "mean":
            if mask is None:
                return sequence.mean(dim=1)
            weights = mask.to(sequence.dtype)[..., None]
            return (sequence * weights).sum(dim=1) / weights.sum(dim=1)
        scores = self.score(sequence).squeeze(-1)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return (torch.softmax(scores, dim=1)[..., None] * sequence).sum(dim=1)


def check_heads(component: Component, width: int, heads: int) -> None:
    if width % heads:
        raise ComponentError.at(
            component.where("num_heads"),
            component.label,
            f"num_heads {heads} does not divide the input width {width} "
            "(every head attends over width / num_heads features)",
            "choose num_heads among "
            + ", ".join(str(h) for h in range(1, min(width, 16) + 1) if width % h == 0),
        )


def padding_mask(
    inputs: Batch, use_lengths: bool, steps: int, device: torch.device
) -> torch.Tensor | None:
    """[batch, steps] bool, True on valid steps; None when lengths are not used."""
    if not use_lengths:
        return None
    return length_mask(checked_lengths(inputs["lengths"], steps).to(device), steps)


def sequence_specs(width: int, use_lengths: bool) -> dict[str, StreamSpec]:
    specs = {"inputs": StreamSpec(("batch", -1, width), FLOATING, "vector sequences")}
    if use_lengths:
        specs["lengths"] = StreamSpec(("batch",), torch.int64, "length of every sequence")
    return specs


def pooled_spec(width: int, pooling: Pooling, what: str) -> StreamSpec:
    if pooling == "none":
        return StreamSpec(("batch", -1, width), FLOATING, f"{what} at every step")
    return StreamSpec(("batch", width), FLOATING, f"{what}, pooled ({pooling}) over the steps")


class SelfAttentionParams(ComponentParams):
    num_heads: int = Field(
        1, gt=0, description="Attention heads; must divide the input width (input_size)."
    )
    dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="Dropout on the attention weights (training only)."
    )
    residual: bool = Field(
        False,
        description="Add the inputs to the attended sequence and layer-normalise the sum "
        "(the first half of a Transformer block).",
    )
    use_lengths: bool = Field(
        False,
        description="Read a `lengths` stream: padding is never attended to, never pooled, and "
        "the outputs at padded steps are zeros.",
    )
    pooling: Pooling = Field("none", description=POOLING_DESCRIPTION)
    output_attention: bool = Field(
        False,
        description="Also write the attention weights, averaged over the heads (`attention`).",
    )


class SelfAttention(Model):
    """Multi-head scaled dot-product self-attention (torch.nn.MultiheadAttention,
    batch-first): every step of a sequence attends to every (valid) step of the same sequence.
    Optionally residual + LayerNorm, and pooled to one vector per sequence.

    Streams in: `inputs` [batch, -1, input_size] float (e.g. word embeddings, or an RNN's
    `outputs`); `lengths` [batch] int64 with `use_lengths: true` (padding mask).

    Streams out: `outputs`: [batch, -1, input_size] with `pooling: none`, [batch, input_size]
    with `pooling: mean | attention`; `attention` [batch, -1, -1] with
    `output_attention: true` (weights over the keys, last axis, of every query step).

    Globals: needs `input_size` (the width, kept by the outputs; num_heads must divide it).

    ```yaml
    pipeline:
      sentence_encoder:
        type: SelfAttention
        num_heads: 4
        pooling: attention
        use_lengths: true
        streams: {inputs: embeddings, outputs: sentence_vectors}
        globals: {input_size: embeddings_size}
      classifier:
        type: FeedForwardNetwork
        streams: {inputs: sentence_vectors}
        globals: {input_size: embeddings_size, prediction_size: num_classes}
    ```
    """

    Params = SelfAttentionParams
    params: SelfAttentionParams
    EXAMPLE_GLOBALS = {"input_size": 64}
    NEEDS_GLOBALS = {"input_size": "width of the input vectors of every step"}

    def __init__(self, params: SelfAttentionParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.input_size = int(self.global_value("input_size"))
        check_heads(self, self.input_size, params.num_heads)
        self.attention = nn.MultiheadAttention(
            self.input_size, params.num_heads, dropout=params.dropout, batch_first=True
        )
        if params.residual:
            self.norm = nn.LayerNorm(self.input_size)
        if params.pooling != "none":
            self.pooling = SequencePooling(params.pooling, self.input_size)

    def input_specs(self) -> dict[str, StreamSpec]:
        return sequence_specs(self.input_size, self.params.use_lengths)

    def output_specs(self) -> dict[str, StreamSpec]:
        specs = {"outputs": pooled_spec(self.input_size, self.params.pooling, "attended vectors")}
        if self.params.output_attention:
            specs["attention"] = StreamSpec(
                ("batch", -1, -1), FLOATING, "attention weights, query step x key step"
            )
        return specs

    def forward(self, inputs: Batch) -> Batch:
        sequence = inputs["inputs"]
        mask = padding_mask(inputs, self.params.use_lengths, sequence.shape[1], sequence.device)
        attended, weights = self.attention(
            sequence,
            sequence,
            sequence,
            key_padding_mask=None if mask is None else ~mask,
            need_weights=self.params.output_attention,
        )
        if self.params.residual:
            attended = self.norm(sequence + attended)
        if mask is not None:
            attended = attended * mask[..., None].to(attended.dtype)
        results: Batch = {"outputs": attended}
        if self.params.pooling != "none":
            results["outputs"] = self.pooling(attended, mask)
        if self.params.output_attention:
            results["attention"] = weights
        return results
