"""A GRU decoder with additive (Bahdanau) attention over an encoder's outputs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch
from pydantic import Field
from torch import nn

from torchloom.core.component import Batch, BuildContext, ComponentParams
from torchloom.core.streams import FLOATING, Dim, StreamSpec
from torchloom.zoo.models.recurrent import checked_lengths, length_mask
from torchloom.zoo.models.seq2seq import (
    DecoderParams,
    StepwiseDecoder,
    check_decoder_params,
    decoded_steps,
    decoder_input_specs,
    finish,
    next_words,
)


class AttentionDecoderParams(DecoderParams):
    hidden_size: int = Field(128, gt=0, description="Width of the decoder's GRU state.")
    attention_size: int = Field(
        128, gt=0, description="Width of the additive attention's hidden layer."
    )
    initial_state: Literal["zero", "mean", "input"] = Field(
        "mean",
        description="How the decoder state starts: zero; mean (tanh of a linear map of the "
        "mean encoder output, over each source's valid steps); input (tanh of a linear map of "
        "the `initial_state` stream, e.g. the encoder's `final_state`).",
    )
    use_lengths: bool = Field(
        False,
        description="Read the source `lengths` and never attend to the source's padding.",
    )
    output_attention: bool = Field(
        False, description="Also write the attention weights of every step (`attention`)."
    )


class AttentionDecoder(StepwiseDecoder):
    """A GRU decoder with additive attention (Bahdanau et al. 2015) over the outputs of an
    encoder (a `RecurrentNeuralNetwork` with `prediction_mode: none`, a `TransformerEncoder`).

    At every step: the previous word (`start_index`, <EOS> by default, at the first step) is
    embedded; the attention scores every source step from the previous decoder state,
    v . tanh(W_q s + W_k h_j), masked to each source's length with `use_lengths`; the context
    (the weighted sum of encoder outputs) and the word embedding feed a GRU cell; the new
    state and the context give the word's log-probabilities. In training each step is fed the
    target word with probability `teacher_forcing_ratio`, otherwise (and always outside
    training) the decoder's own previous prediction.

    Streams in:
    - `inputs` [batch, -1, input_size] float: the encoder outputs;
    - `lengths` [batch] int64, with `use_lengths: true`: source lengths;
    - `initial_state` [batch, initial_state_size] float, with `initial_state: input`;
    - `targets` [batch, -1] int64, unless `autoregression_length` is set: the target words
      (ending with <EOS>); the decoder runs as many steps as they have.

    Streams out:
    - `predictions` [batch, -1, classes=prediction_size] float: word log-probabilities per
      step (for `NLLLoss`/`AccuracyStatistics` with `sequence: true, ignore_index: 0`, and
      `BLEUStatistics`);
    - `attention` [batch, -1, -1] float, with `output_attention: true`: weights over the
      source steps (last axis) of every decoded step (middle axis).

    Globals: needs `input_size` (width of the encoder outputs: a RecurrentNeuralNetwork's
    `rnn_hidden_size`), `prediction_size` (output vocabulary size), and with
    `initial_state: input` `initial_state_size` (e.g. `rnn_state_size`).

    ```yaml
    pipeline:
      encoder:
        type: RecurrentNeuralNetwork
        cell_type: GRU
        bidirectional: true
        prediction_mode: none
        use_lengths: true
        streams: {inputs: source_embeddings, lengths: source_lengths,
                  outputs: encoder_outputs, final_state: encoder_state}
        globals: {input_size: embeddings_size}
      decoder:
        type: AttentionDecoder
        hidden_size: 128
        teacher_forcing_ratio: 0.5
        use_lengths: true
        initial_state: input
        streams: {inputs: encoder_outputs, lengths: source_lengths,
                  initial_state: encoder_state, targets: target_indices}
        globals: {input_size: rnn_hidden_size, initial_state_size: rnn_state_size,
                  prediction_size: target_vocabulary_size}
    ```
    """

    Params = AttentionDecoderParams
    params: AttentionDecoderParams
    EXAMPLE_GLOBALS = {"input_size": 128, "prediction_size": 1000, "initial_state_size": 128}

    @classmethod
    def needed_globals(cls, params: ComponentParams) -> Mapping[str, str]:
        assert isinstance(params, AttentionDecoderParams)
        needed = {
            "input_size": "width of the encoder outputs",
            "prediction_size": "size of the output vocabulary",
        }
        if params.initial_state == "input":
            needed["initial_state_size"] = "width of the `initial_state` stream"
        return needed

    def __init__(self, params: AttentionDecoderParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.input_size = int(self.global_value("input_size"))
        self.prediction_size = int(self.global_value("prediction_size"))
        check_decoder_params(self, params, self.prediction_size)
        self.state_source_size = 0
        if params.initial_state == "input":
            self.state_source_size = int(self.global_value("initial_state_size"))
        elif params.initial_state == "mean":
            self.state_source_size = self.input_size
        if self.state_source_size:
            self.bridge = nn.Linear(self.state_source_size, params.hidden_size)
        self.embedding = nn.Embedding(self.prediction_size, params.embedding_size)
        self.query = nn.Linear(params.hidden_size, params.attention_size, bias=False)
        self.key = nn.Linear(self.input_size, params.attention_size)
        self.energy = nn.Linear(params.attention_size, 1, bias=False)
        self.cell = nn.GRUCell(params.embedding_size + self.input_size, params.hidden_size)
        self.dropout = nn.Dropout(params.dropout)
        self.output = nn.Linear(params.hidden_size + self.input_size, self.prediction_size)

    def input_specs(self) -> dict[str, StreamSpec]:
        specs = {"inputs": StreamSpec(("batch", -1, self.input_size), FLOATING, "encoder outputs")}
        if self.params.use_lengths:
            specs["lengths"] = StreamSpec(("batch",), torch.int64, "source lengths")
        if self.params.initial_state == "input":
            specs["initial_state"] = StreamSpec(
                ("batch", self.state_source_size), FLOATING, "state the decoder starts from"
            )
        return specs | decoder_input_specs(self.params)

    def output_specs(self) -> dict[str, StreamSpec]:
        kind = "log-probabilities" if self.params.log_softmax else "logits"
        dims = ("batch", -1, Dim("classes", self.prediction_size))
        specs = {"predictions": StreamSpec(dims, FLOATING, f"word {kind} per step")}
        if self.params.output_attention:
            specs["attention"] = StreamSpec(
                ("batch", -1, -1), FLOATING, "attention over the source steps, per decoded step"
            )
        return specs

    def _start_state(
        self, inputs: Batch, encoded: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        mode = self.params.initial_state
        if mode == "zero":
            return encoded.new_zeros(encoded.shape[0], self.params.hidden_size)
        if mode == "input":
            source = inputs["initial_state"]
        elif mask is None:
            source = encoded.mean(dim=1)
        else:
            weights = mask.to(encoded.dtype)[..., None]
            source = (encoded * weights).sum(dim=1) / weights.sum(dim=1)
        return torch.tanh(self.bridge(source))

    def forward(self, inputs: Batch) -> Batch:
        encoded = inputs["inputs"]
        batch, source_steps = encoded.shape[:2]
        mask = None
        if self.params.use_lengths:
            lengths = checked_lengths(inputs["lengths"], source_steps).to(encoded.device)
            mask = length_mask(lengths, source_steps)
        state = self._start_state(inputs, encoded, mask)
        keys = self.key(encoded)  # the same at every step: computed once
        word = torch.full((batch,), self.params.start_index, device=encoded.device)
        predictions, attention = [], []
        for step in range(decoded_steps(self.params, inputs)):
            logits, state, weights = self.step(word, state, keys, encoded, mask)
            predictions.append(finish(logits, self.params.log_softmax))
            attention.append(weights)
            word = next_words(logits.argmax(dim=-1), inputs, step, self.params, self.training)
        results: Batch = {"predictions": self._stack(predictions, encoded, self.prediction_size)}
        if self.params.output_attention:
            results["attention"] = self._stack(attention, encoded, source_steps)
        return results

    def decode_step(
        self,
        word: torch.Tensor,
        state: torch.Tensor,
        keys: torch.Tensor,
        encoded: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The next word's logits, the decoder's state and the attention weights, from the
        previous word and state."""
        scores = self.energy(torch.tanh(keys + self.query(state)[:, None])).squeeze(-1)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        context = torch.bmm(weights[:, None], encoded)[:, 0]
        embedded = self.dropout(self.embedding(word))
        state = self.cell(torch.cat([embedded, context], dim=-1), state)
        logits = self.output(self.dropout(torch.cat([state, context], dim=-1)))
        return logits, state, weights

    @staticmethod
    def _stack(steps: list[torch.Tensor], like: torch.Tensor, width: int) -> torch.Tensor:
        if not steps:  # a batch of empty targets
            return like.new_zeros(like.shape[0], 0, width)
        return torch.stack(steps, dim=1)
