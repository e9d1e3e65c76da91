"""Recurrent networks (LSTM, GRU, Elman RNN) over sequences of vectors, with packed variable
lengths; also the length helpers the other sequence models share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch
from pydantic import Field
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from torchloom.core.component import Batch, BuildContext, ComponentParams, Model
from torchloom.core.streams import FLOATING, Dim, StreamSpec

CellType = Literal["LSTM", "GRU", "RNN_TANH", "RNN_RELU"]
# The hidden state of an LSTM is (h, c); of the others, h alone.
State = torch.Tensor | tuple[torch.Tensor, torch.Tensor]
BF16 = torch.bfloat16


def checked_lengths(lengths: torch.Tensor, steps: int) -> torch.Tensor:
    """Lengths clamped to [1, steps]: an empty sentence is read as one padding step (packing
    and attention over zero steps are undefined), and a length beyond the padded batch can
    only mean the whole row."""
    return lengths.clamp(min=1, max=max(steps, 1))


def length_mask(lengths: torch.Tensor, steps: int) -> torch.Tensor:
    """[batch, steps] bool, True on the steps inside each sequence's length."""
    return torch.arange(steps, device=lengths.device)[None, :] < lengths[:, None]


def make_rnn(
    cell_type: CellType,
    input_size: int,
    hidden_size: int,
    num_layers: int,
    bidirectional: bool,
    dropout: float,
) -> nn.RNNBase:
    """torch's batch-first recurrent layer of the given cell type."""
    # torch applies `dropout` only between stacked layers and warns when there are none.
    options = {
        "input_size": input_size,
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "bidirectional": bidirectional,
        "dropout": dropout if num_layers > 1 else 0.0,
        "batch_first": True,
    }
    if cell_type == "LSTM":
        return nn.LSTM(**options)
    if cell_type == "GRU":
        return nn.GRU(**options)
    nonlinearity = "tanh" if cell_type == "RNN_TANH" else "relu"
    return nn.RNN(nonlinearity=nonlinearity, **options)


def run_rnn(
    rnn: nn.RNNBase, inputs: torch.Tensor, lengths: torch.Tensor | None, state: State | None
) -> tuple[torch.Tensor, State]:
    """Outputs [batch, steps, directions * hidden] and the final state of `rnn` over `inputs`.

    With lengths, the sequences are packed (unsorted: torch sorts and restores the order,
    initial state included), so every sequence stops at its own last step: its final state
    is the state there, and its outputs past its length are zeros."""
    if lengths is None:
        return call_rnn(rnn, inputs, state)
    steps = inputs.shape[1]
    # pack_padded_sequence wants the lengths on the CPU: one small copy per batch.
    packed = pack_padded_sequence(
        inputs, checked_lengths(lengths, steps).cpu(), batch_first=True, enforce_sorted=False
    )
    packed_outputs, final = call_rnn(rnn, packed, state)
    outputs, _ = pad_packed_sequence(packed_outputs, batch_first=True, total_length=steps)
    return outputs, final


def call_rnn(rnn: nn.RNNBase, inputs: Any, state: State | None) -> tuple[Any, State]:
    """`rnn(inputs, state)`; under bf16 autocast, in float32 with autocast off. On a GPU
    torch's autocast runs cuDNN's recurrent layers in fp16 whatever autocast's dtype is: their
    fp16 outputs then meet bf16 tensors in operations autocast will not mix (a `cat` fails
    with "Unexpected floating ScalarType"), and fp16 without the gradient scaler a bf16 run
    does not have can underflow. float32 is what autocast leaves the sums and losses in."""
    device = (inputs.data if isinstance(inputs, PackedSequence) else inputs).device.type
    if not (torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == BF16):
        return rnn(inputs, state)
    if isinstance(state, tuple):
        state = (state[0].float(), state[1].float())
    elif state is not None:
        state = state.float()
    with torch.autocast(device, enabled=False):
        return rnn(inputs.float(), state)


def state_to_flat(state: State) -> torch.Tensor:
    """[layers * directions, batch, hidden] (and the LSTM's cell) -> [batch, state_size]:
    layer by layer (forward, then backward direction), h first, then an LSTM's c."""
    parts = state if isinstance(state, tuple) else (state,)
    return torch.cat([part.transpose(0, 1).reshape(part.shape[1], -1) for part in parts], dim=1)


def state_from_flat(flat: torch.Tensor, layers: int, hidden: int, lstm: bool) -> State:
    """The inverse of `state_to_flat`."""
    batch = flat.shape[0]
    parts = flat.reshape(batch, 2 if lstm else 1, layers, hidden).permute(1, 2, 0, 3)
    if lstm:
        return parts[0].contiguous(), parts[1].contiguous()
    return parts[0].contiguous()


class RecurrentNeuralNetworkParams(ComponentParams):
    cell_type: CellType = Field(
        "LSTM", description="LSTM, GRU, or an Elman RNN with tanh (RNN_TANH) or ReLU (RNN_RELU)."
    )
    hidden_size: int = Field(64, gt=0, description="Width of the hidden state of every layer.")
    num_layers: int = Field(1, ge=1, le=32, description="Number of stacked recurrent layers.")
    bidirectional: bool = Field(
        False,
        description="Also read every sequence backwards; the outputs then carry both "
        "directions (2 * hidden_size wide).",
    )
    dropout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Dropout between stacked layers and on the outputs before the "
        "prediction layer.",
    )
    prediction_mode: Literal["dense", "last", "none"] = Field(
        "dense",
        description="dense: a prediction at every step, [batch, -1, prediction_size]; last: one "
        "per sequence from its last valid step, [batch, prediction_size]; none: no "
        "`predictions`, only `outputs` and `final_state` (an encoder).",
    )
    initial_state: Literal["zero", "trainable", "input"] = Field(
        "zero",
        description="zero; trainable (a learnt initial state shared by all sequences); input "
        "(read from the `initial_state` stream, e.g. an encoder's `final_state`).",
    )
    use_lengths: bool = Field(
        False,
        description="Read a `lengths` stream and pack the sequences, so that each stops at its "
        "own length (padding never enters the state).",
    )
    log_softmax: bool = Field(
        True,
        description="End the predictions with log_softmax (for NLLLoss); false gives raw "
        "outputs (logits for CrossEntropyLoss).",
    )


class RecurrentNeuralNetwork(Model):
    """A recurrent network (LSTM, GRU, RNN with tanh or ReLU; stacked; optionally
    bidirectional) over sequences of vectors, e.g. word embeddings.

    Streams in:
    - `inputs` [batch, -1, input_size] float: the sequences (padded to the longest);
    - `lengths` [batch] int64, with `use_lengths: true`: each sequence's length; the batch is
      packed, so padding changes nothing (the result equals running each sequence alone);
    - `initial_state` [batch, state_size] float, with `initial_state: input` (an encoder's
      `final_state`, same layout).

    Streams out:
    - `predictions`: prediction_mode dense: [batch, -1, classes=prediction_size], one per
      step (the steps past a sequence's length are padding: give them the loss's
      `ignore_index`); last: [batch, classes=prediction_size] from each sequence's own last
      valid step (bidirectional: forward direction at the last step, backward direction at
      the first, i.e. both directions after reading the whole sequence); log-probabilities
      unless `log_softmax: false`. Absent with prediction_mode none;
    - `outputs` [batch, -1, rnn_hidden_size]: the top layer's hidden state at every step
      (zeros past each length with `use_lengths`); what attention decoders read;
    - `final_state` [batch, rnn_state_size]: the final hidden state of every layer and
      direction, flattened layer by layer (forward, backward) as h, then the LSTM's c.

    Globals: needs `input_size` (width of `inputs`; map it to e.g. `embeddings_size`) and,
    unless prediction_mode is none, `prediction_size` (classes, or a vocabulary size for a
    language model); publishes `rnn_hidden_size` (hidden_size x directions) and
    `rnn_state_size` (layers x directions x hidden_size, x 2 for an LSTM). Rename them with
    `globals:` when a pipeline has two recurrent networks of different sizes.

    ```yaml
    pipeline:
      # a sentence classifier over word embeddings
      classifier:
        type: RecurrentNeuralNetwork
        cell_type: GRU
        hidden_size: 128
        bidirectional: true
        prediction_mode: last
        use_lengths: true
        streams: {inputs: embeddings}
        globals: {input_size: embeddings_size, prediction_size: num_classes}
      # an encoder for an AttentionDecoder
      encoder:
        type: RecurrentNeuralNetwork
        cell_type: GRU
        prediction_mode: none
        use_lengths: true
        streams: {inputs: source_embeddings, lengths: source_lengths,
                  outputs: encoder_outputs, final_state: encoder_state}
        globals: {input_size: embeddings_size}
    ```
    """

    Params = RecurrentNeuralNetworkParams
    params: RecurrentNeuralNetworkParams
    EXAMPLE_GLOBALS = {"input_size": 50, "prediction_size": 10}
    PUBLISHES_GLOBALS = {
        "rnn_hidden_size": "width of `outputs`: hidden_size x directions",
        "rnn_state_size": "width of `final_state`: layers x directions x hidden_size "
        "(x 2 for an LSTM)",
    }

    @classmethod
    def needed_globals(cls, params: ComponentParams) -> Mapping[str, str]:
        assert isinstance(params, RecurrentNeuralNetworkParams)
        needed = {"input_size": "width of the input vectors of every step"}
        if params.prediction_mode != "none":
            needed["prediction_size"] = "number of outputs per prediction, usually classes"
        return needed

    def __init__(self, params: RecurrentNeuralNetworkParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.input_size = int(self.global_value("input_size"))
        self.prediction_size = (
            int(self.global_value("prediction_size")) if params.prediction_mode != "none" else 0
        )
        self.directions = 2 if params.bidirectional else 1
        self.layers = params.num_layers * self.directions  # rows of torch's state tensors
        self.is_lstm = params.cell_type == "LSTM"
        self.output_size = params.hidden_size * self.directions
        self.state_size = self.layers * params.hidden_size * (2 if self.is_lstm else 1)
        self.rnn = make_rnn(
            params.cell_type,
            self.input_size,
            params.hidden_size,
            params.num_layers,
            params.bidirectional,
            params.dropout,
        )
        if params.initial_state == "trainable":
            shape = (1, self.state_size)
            self.learnt_state = nn.Parameter(torch.zeros(shape))
        self.dropout = nn.Dropout(params.dropout)
        if params.prediction_mode != "none":
            self.prediction = nn.Linear(self.output_size, self.prediction_size)
        self.publish_global("rnn_hidden_size", self.output_size)
        self.publish_global("rnn_state_size", self.state_size)

    def input_specs(self) -> dict[str, StreamSpec]:
        specs = {"inputs": StreamSpec(("batch", -1, self.input_size), FLOATING, "vector sequences")}
        if self.params.use_lengths:
            specs["lengths"] = StreamSpec(("batch",), torch.int64, "length of every sequence")
        if self.params.initial_state == "input":
            specs["initial_state"] = StreamSpec(
                ("batch", self.state_size), FLOATING, "initial hidden state, flattened"
            )
        return specs

    def output_specs(self) -> dict[str, StreamSpec]:
        kind = "log-probabilities" if self.params.log_softmax else "scores"
        specs = {}
        classes = Dim("classes", self.prediction_size)
        if self.params.prediction_mode == "dense":
            specs["predictions"] = StreamSpec(("batch", -1, classes), FLOATING, f"{kind} per step")
        elif self.params.prediction_mode == "last":
            specs["predictions"] = StreamSpec(
                ("batch", classes), FLOATING, f"{kind} from the last step"
            )
        specs["outputs"] = StreamSpec(
            ("batch", -1, self.output_size), FLOATING, "top layer's hidden state per step"
        )
        specs["final_state"] = StreamSpec(
            ("batch", self.state_size), FLOATING, "final state of every layer, flattened"
        )
        return specs

    def _initial_state(self, inputs: Batch, batch: int) -> State | None:
        mode = self.params.initial_state
        if mode == "zero":
            return None  # torch's own zeros
        flat = inputs["initial_state"] if mode == "input" else self.learnt_state.expand(batch, -1)
        return state_from_flat(flat, self.layers, self.params.hidden_size, self.is_lstm)

    def _last_outputs(self, outputs: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        """Each sequence's output after reading all of it: the forward direction at its last
        valid step, the backward direction (if any) at the first step."""
        batch, steps = outputs.shape[:2]
        if lengths is None:
            last = torch.full((batch,), steps - 1, device=outputs.device)
        else:
            last = checked_lengths(lengths, steps).to(outputs.device) - 1
        hidden = self.params.hidden_size
        forward = outputs[torch.arange(batch, device=outputs.device), last, :hidden]
        if self.directions == 1:
            return forward
        return torch.cat([forward, outputs[:, 0, hidden:]], dim=1)

    def forward(self, inputs: Batch) -> Batch:
        sequences = inputs["inputs"]
        lengths = inputs["lengths"] if self.params.use_lengths else None
        state = self._initial_state(inputs, sequences.shape[0])
        outputs, final = run_rnn(self.rnn, sequences, lengths, state)
        results: Batch = {"outputs": outputs, "final_state": state_to_flat(final)}
        mode = self.params.prediction_mode
        if mode == "none":
            return results
        features = outputs if mode == "dense" else self._last_outputs(outputs, lengths)
        predictions = self.prediction(self.dropout(features))
        if self.params.log_softmax:
            predictions = torch.log_softmax(predictions, dim=-1)
        results["predictions"] = predictions
        return results
