"""An encoder-decoder recurrent network (Sutskever et al. 2014): a sequence of vectors in, a
sequence of word log-probabilities out; plus the decoding helpers `AttentionDecoder` shares."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
from pydantic import Field
from torch import nn

from torchloom.core.component import Batch, BuildContext, Component, ComponentParams, Model
from torchloom.core.streams import FLOATING, Dim, StreamSpec
from torchloom.errors import ComponentError, Problem
from torchloom.zoo.models.recurrent import call_rnn, make_rnn, run_rnn


class DecoderParams(ComponentParams):
    """Parameters every autoregressive decoder shares."""

    embedding_size: int = Field(
        64, gt=0, description="Width of the decoder's own embedding of the previous word."
    )
    dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="Dropout on the word embeddings and before the output."
    )
    teacher_forcing_ratio: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="In training, the probability that a step is fed the target word instead "
        "of the decoder's own previous prediction (drawn per step and sequence from torch's "
        "global generator, so exact resume holds). Never used outside training.",
    )
    autoregression_length: int | None = Field(
        None,
        gt=0,
        description="Steps to decode. null: as many as the `targets` stream has (which is then "
        "read, for the length and teacher forcing). A number: exactly that many, and no "
        "`targets` are read (inference without targets; teacher_forcing_ratio must be 0).",
    )
    start_index: int = Field(
        1,
        ge=0,
        description="Word fed at the first step; 1 is <EOS> in SentenceIndexer's vocabulary "
        "(<PAD>=0, <EOS>=1, <UNK>=2), which is also the usual end-of-sentence target.",
    )
    log_softmax: bool = Field(
        True, description="End with log_softmax (for NLLLoss); false gives raw logits."
    )


def check_decoder_params(component: Component, params: DecoderParams, vocabulary: int) -> None:
    """Build-time errors for decoder parameters that cannot work together."""
    problems = []
    if params.start_index >= vocabulary:
        problems.append(
            Problem(
                component.where("start_index"),
                component.label,
                f"start_index {params.start_index} is not a word of the output vocabulary "
                f"(prediction_size {vocabulary})",
                "use the <EOS> index (1 with SentenceIndexer) or another index below it",
            )
        )
    if params.autoregression_length is not None and params.teacher_forcing_ratio > 0:
        problems.append(
            Problem(
                component.where("teacher_forcing_ratio"),
                component.label,
                f"teacher_forcing_ratio {params.teacher_forcing_ratio} needs the `targets`, "
                "which are not read with a fixed autoregression_length",
                "set teacher_forcing_ratio: 0, or autoregression_length: null to decode as many "
                "steps as the targets have",
            )
        )
    if problems:
        raise ComponentError(problems)


def decoder_input_specs(params: DecoderParams) -> dict[str, StreamSpec]:
    if params.autoregression_length is not None:
        return {}
    return {
        "targets": StreamSpec(
            ("batch", -1), torch.int64, "target word indices (teacher forcing, decoded length)"
        )
    }


def decoded_steps(params: DecoderParams, inputs: Batch) -> int:
    if params.autoregression_length is not None:
        return params.autoregression_length
    return int(inputs["targets"].shape[1])


def teacher_words(targets: torch.Tensor) -> torch.Tensor:
    # Ignored target positions (-100) are padding after the sentence's end: feed <PAD> (0),
    # whose predictions the loss leaves out anyway.
    return targets.clamp(min=0)


def next_words(
    predicted: torch.Tensor, inputs: Batch, step: int, params: DecoderParams, training: bool
) -> torch.Tensor:
    """The words fed to the next step: the decoder's own predictions, or in training the
    targets with probability `teacher_forcing_ratio` (per sequence)."""
    ratio = params.teacher_forcing_ratio
    if not training or ratio == 0.0:
        return predicted
    teacher = teacher_words(inputs["targets"][:, step])
    if ratio == 1.0:
        return teacher  # no draw: the random streams stay where a ratio-0 run leaves them
    use_teacher = torch.rand(predicted.shape[0], device=predicted.device) < ratio
    return torch.where(use_teacher, teacher, predicted)


def finish(logits: torch.Tensor, log_softmax: bool) -> torch.Tensor:
    return torch.log_softmax(logits, dim=-1) if log_softmax else logits


class StepwiseDecoder(Model):
    """A decoder whose forward loops over the words it decodes, as many as the batch's targets
    have: a count that changes from batch to batch. torch.compile unrolls such a loop and
    specialises on its count, so a decoder compiled whole compiles again for each new length,
    and after 8 (torch's recompile limit) runs eagerly. `training.compile` therefore compiles
    one step of the loop (`decode_step`, called through `step`), the same at every length."""

    decode_step: Callable[..., Any]
    _compiled_step: Callable[..., Any] | None = None

    def compile(self, *args: Any, **kwargs: Any) -> None:
        # The class's function, not the bound method: a deep copy of the model (quantization
        # copies models) then steps with its own weights, not with this one's.
        self._compiled_step = torch.compile(type(self).decode_step, *args, **kwargs)

    def step(self, *args: Any) -> Any:
        if self._compiled_step is None:
            return self.decode_step(*args)
        return self._compiled_step(self, *args)


class Seq2SeqParams(DecoderParams):
    cell_type: Literal["LSTM", "GRU"] = Field(
        "GRU", description="Recurrent cell of both the encoder and the decoder."
    )
    hidden_size: int = Field(128, gt=0, description="Hidden width of the encoder and decoder.")
    num_layers: int = Field(
        1, ge=1, le=32, description="Stacked layers of the encoder and of the decoder."
    )
    use_lengths: bool = Field(
        False,
        description="Read the source `lengths` and pack the source, so that the encoder's "
        "final state is taken at each sequence's own last word.",
    )


class Seq2Seq(StepwiseDecoder):
    """Sequence to sequence (Sutskever et al. 2014): an encoder RNN reads the source vectors,
    its final state starts a decoder RNN that writes the output words one by one, each step
    fed the previous word through the decoder's own embedding (the first step is fed
    `start_index`, <EOS> by default).

    In training, each step is fed the target word with probability `teacher_forcing_ratio`
    (otherwise the decoder's own previous prediction); at 1.0 the whole target is decoded in
    one call. Outside training the decoder always feeds itself.

    Streams in:
    - `inputs` [batch, -1, input_size] float: the source, e.g. word embeddings;
    - `lengths` [batch] int64, with `use_lengths: true`: source lengths;
    - `targets` [batch, -1] int64, unless `autoregression_length` is set: the target words
      (SentenceIndexer's `word_indices` of the target sentences, ending with <EOS>); the
      decoder runs as many steps as they have, in training and in evaluation.

    Streams out: `predictions` [batch, -1, classes=prediction_size] float: log-probabilities of
    the words at every step; pair them with `NLLLoss` / `AccuracyStatistics` with
    `sequence: true` and `ignore_index: 0` (<PAD>), and with `BLEUStatistics`.

    Globals: needs `input_size` (width of `inputs`, e.g. `embeddings_size`) and
    `prediction_size` (the output vocabulary size).

    ```yaml
    pipeline:
      translator:
        type: Seq2Seq
        cell_type: LSTM
        hidden_size: 256
        teacher_forcing_ratio: 0.5
        use_lengths: true
        streams: {inputs: source_embeddings, lengths: source_lengths,
                  targets: target_indices}
        globals: {input_size: embeddings_size, prediction_size: target_vocabulary_size}
      loss: {type: NLLLoss, sequence: true, ignore_index: 0,
             streams: {targets: target_indices}}
    ```
    """

    Params = Seq2SeqParams
    params: Seq2SeqParams
    EXAMPLE_GLOBALS = {"input_size": 50, "prediction_size": 1000}
    NEEDS_GLOBALS = {
        "input_size": "width of the source vectors",
        "prediction_size": "size of the output vocabulary",
    }

    def __init__(self, params: Seq2SeqParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.input_size = int(self.global_value("input_size"))
        self.prediction_size = int(self.global_value("prediction_size"))
        check_decoder_params(self, params, self.prediction_size)
        rnn_options = (params.hidden_size, params.num_layers, False, params.dropout)
        self.encoder = make_rnn(params.cell_type, self.input_size, *rnn_options)
        self.embedding = nn.Embedding(self.prediction_size, params.embedding_size)
        self.decoder = make_rnn(params.cell_type, params.embedding_size, *rnn_options)
        self.dropout = nn.Dropout(params.dropout)
        self.output = nn.Linear(params.hidden_size, self.prediction_size)

    def input_specs(self) -> dict[str, StreamSpec]:
        specs = {"inputs": StreamSpec(("batch", -1, self.input_size), FLOATING, "source vectors")}
        if self.params.use_lengths:
            specs["lengths"] = StreamSpec(("batch",), torch.int64, "source lengths")
        return specs | decoder_input_specs(self.params)

    def output_specs(self) -> dict[str, StreamSpec]:
        kind = "log-probabilities" if self.params.log_softmax else "logits"
        dims = ("batch", -1, Dim("classes", self.prediction_size))
        return {"predictions": StreamSpec(dims, FLOATING, f"word {kind} per step")}

    def forward(self, inputs: Batch) -> Batch:
        lengths = inputs["lengths"] if self.params.use_lengths else None
        source = inputs["inputs"]
        _, state = run_rnn(self.encoder, source, lengths, None)
        batch, steps = source.shape[0], decoded_steps(self.params, inputs)
        if steps == 0:  # a batch of empty targets
            return {"predictions": source.new_zeros(batch, 0, self.prediction_size)}
        start = torch.full((batch, 1), self.params.start_index, device=source.device)
        if self.training and self.params.teacher_forcing_ratio == 1.0:
            # Every step is fed its target: one call over the shifted targets.
            fed = torch.cat([start, teacher_words(inputs["targets"][:, :-1])], dim=1)
            outputs, _ = call_rnn(self.decoder, self.dropout(self.embedding(fed)), state)
            return {"predictions": self._predict(outputs)}
        word, predictions = start[:, 0], []
        for step in range(steps):
            logits, state = self.step(word, state)
            predictions.append(logits)
            word = next_words(logits.argmax(dim=-1), inputs, step, self.params, self.training)
        return {"predictions": torch.stack(predictions, dim=1)}

    def decode_step(self, word: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        """The next word's scores and the decoder's state, from the previous word."""
        embedded = self.dropout(self.embedding(word))[:, None]
        output, state = call_rnn(self.decoder, embedded, state)
        return self._predict(output[:, 0]), state

    def _predict(self, outputs: torch.Tensor) -> torch.Tensor:
        return finish(self.output(self.dropout(outputs)), self.params.log_softmax)
