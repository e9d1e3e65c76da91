"""Recurrent and attention models: they learn toy sequence tasks, packed variable lengths
equal running every sequence alone, shapes follow the specs, and bad parameters are build
errors naming the key. Also the sequence mode of the losses and of AccuracyStatistics."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from torchloom.cli.main import main
from torchloom.core.component import Batch, BuildContext, Component, ComponentParams, Task
from torchloom.core.streams import StreamSpec
from torchloom.errors import ComponentError
from torchloom.zoo.losses import CrossEntropyLoss, NLLLoss
from torchloom.zoo.models.attention_decoder import AttentionDecoder
from torchloom.zoo.models.recurrent import (
    RecurrentNeuralNetwork,
    state_from_flat,
    state_to_flat,
)
from torchloom.zoo.models.self_attention import SelfAttention
from torchloom.zoo.models.seq2seq import Seq2Seq
from torchloom.zoo.models.transformer_encoder import TransformerEncoder, sinusoidal_encoding
from torchloom.zoo.statistics import AccuracyStatistics
from torchloom.zoo.text_statistics import BLEUStatistics

CELLS = ["LSTM", "GRU", "RNN_TANH", "RNN_RELU"]
VOCABULARY = 8  # <PAD>=0, <EOS>=1, <UNK>=2, words 3..7


def rnn(**params: object) -> RecurrentNeuralNetwork:
    model = RecurrentNeuralNetwork.create(globals={"input_size": 5, "prediction_size": 3}, **params)
    assert isinstance(model, RecurrentNeuralNetwork)
    return model


def check_specs(component: Component, outputs: Batch, batch: int) -> None:
    """Every output matches its spec's rank, fixed sizes and dtype."""
    specs = component.output_specs()
    assert set(outputs) == set(specs)
    for name, value in outputs.items():
        spec = specs[name]
        assert spec.dims is not None and spec.dtypes is not None
        assert value.dtype in spec.dtypes, name
        assert value.dim() == len(spec.dims), name
        for size, dim in zip(value.shape, spec.dims, strict=True):
            assert size == (batch if dim.name == "batch" else dim.size or size), name


# ---- RecurrentNeuralNetwork -----------------------------------------------------------------


def first_word_batch(size: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """One-hot sequences of 4..10 steps (padded to 10) holding one A and one B among noise
    words; the class says which of A and B comes first (0: A)."""
    lengths = torch.randint(4, 11, (size,), generator=generator)
    labels = torch.randint(0, 2, (size,), generator=generator)
    words = torch.where(torch.rand(size, 10, generator=generator) < 0.5, 0, 3)
    for row in range(size):
        first, second = torch.randperm(int(lengths[row]), generator=generator)[:2].sort().values
        words[row, first], words[row, second] = (1, 2) if labels[row] == 0 else (2, 1)
    valid = torch.arange(10)[None, :] < lengths[:, None]
    inputs = F.one_hot(words, 4).float() * valid[..., None]
    return inputs, lengths, labels


@pytest.mark.parametrize("cell_type", ["GRU", "LSTM"])
def test_rnn_learns_which_word_comes_first(cell_type: str) -> None:
    torch.manual_seed(0)
    model = RecurrentNeuralNetwork.create(
        cell_type=cell_type,
        hidden_size=16,
        prediction_mode="last",
        use_lengths=True,
        globals={"input_size": 4, "prediction_size": 2},
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    generator = torch.Generator().manual_seed(0)
    for _ in range(80):
        inputs, lengths, labels = first_word_batch(32, generator)
        predictions = model({"inputs": inputs, "lengths": lengths})["predictions"]
        loss = NLLLoss.create()({"predictions": predictions, "targets": labels})["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    inputs, lengths, labels = first_word_batch(400, torch.Generator().manual_seed(1))
    accuracy = AccuracyStatistics.create(globals={"num_classes": 2})
    with torch.no_grad():
        accuracy.update(
            {
                "predictions": model({"inputs": inputs, "lengths": lengths})["predictions"],
                "targets": labels,
            }
        )
    assert accuracy.compute()["accuracy"] > 0.95  # chance: 0.5


@pytest.mark.parametrize("cell_type", CELLS)
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("initial_state", ["trainable", "input"])
def test_packed_lengths_equal_running_each_sequence_alone(
    cell_type: str, bidirectional: bool, initial_state: str
) -> None:
    torch.manual_seed(0)
    model = rnn(
        cell_type=cell_type,
        bidirectional=bidirectional,
        num_layers=2,
        hidden_size=6,
        prediction_mode="last",
        use_lengths=True,
        initial_state=initial_state,
    ).eval()
    inputs, lengths = torch.randn(4, 7, 5), torch.tensor([7, 3, 1, 5])
    # Non-zero initial states: a learnt one shared by all, or one per sequence, which packing
    # (sorted by length) must keep with its own sequence.
    states = torch.randn(4, model.state_size)
    if initial_state == "trainable":
        with torch.no_grad():
            model.learnt_state.normal_()
    batch = {"inputs": inputs, "lengths": lengths, "initial_state": states}
    together = model({k: v for k, v in batch.items() if k in model.input_specs()})
    check_specs(model, together, 4)
    assert together["outputs"][1, 3:].abs().sum() == 0  # past its length: zeros
    for row, length in enumerate(lengths.tolist()):
        alone = {
            "inputs": inputs[row : row + 1, :length],
            "lengths": lengths[row : row + 1],
            "initial_state": states[row : row + 1],
        }
        alone = model({k: v for k, v in alone.items() if k in model.input_specs()})
        for name in ("predictions", "final_state"):
            assert torch.allclose(alone[name], together[name][row : row + 1], atol=1e-5)
        assert torch.allclose(
            alone["outputs"], together["outputs"][row : row + 1, :length], atol=1e-5
        )


@pytest.mark.parametrize("cell_type", CELLS)
def test_sizes_of_bidirectional_stacked_networks_and_their_globals(cell_type: str) -> None:
    model = rnn(cell_type=cell_type, hidden_size=8, num_layers=3, bidirectional=True)
    lstm = cell_type == "LSTM"
    assert model.output_specs()["outputs"].shape_text() == "[batch, -1, 16]"
    assert model.output_specs()["final_state"].shape_text() == f"[batch, {3 * 2 * 8 * (1 + lstm)}]"
    assert model.output_specs()["predictions"].shape_text() == "[batch, -1, classes=3]"
    store = model._context.store
    assert store.get("rnn_hidden_size", "test") == 16
    assert store.get("rnn_state_size", "test") == 3 * 2 * 8 * (1 + lstm)
    outputs = model({"inputs": torch.randn(2, 4, 5)})
    check_specs(model, outputs, 2)
    assert torch.allclose(outputs["predictions"].exp().sum(-1), torch.ones(2, 4), atol=1e-5)


def test_last_prediction_reads_both_directions_after_the_whole_sequence() -> None:
    torch.manual_seed(0)
    model = rnn(cell_type="GRU", hidden_size=4, bidirectional=True, prediction_mode="last")
    model.eval()
    inputs = torch.randn(3, 6, 5)
    outputs = model({"inputs": inputs})
    _, final = model.rnn(inputs)  # [2 directions, batch, hidden] of the one layer
    last = torch.cat([final[0], final[1]], dim=1)
    expected = torch.log_softmax(model.prediction(last), dim=1)
    assert torch.allclose(outputs["predictions"], expected, atol=1e-6)


def test_initial_state_from_an_encoder_round_trips() -> None:
    torch.manual_seed(0)
    encoder = rnn(cell_type="LSTM", hidden_size=4, num_layers=2, prediction_mode="none")
    decoder = rnn(cell_type="LSTM", hidden_size=4, num_layers=2, initial_state="input")
    assert "prediction_size" not in RecurrentNeuralNetwork.needed_globals(encoder.params)
    assert set(encoder.output_specs()) == {"outputs", "final_state"}
    first_half, second_half = torch.randn(2, 3, 5), torch.randn(2, 4, 5)
    state = encoder({"inputs": first_half})["final_state"]
    continued = decoder({"inputs": second_half, "initial_state": state})
    assert decoder.input_specs()["initial_state"].shape_text() == "[batch, 16]"
    # The same as torch's LSTM reading the second half from the state the first left.
    _, (h, c) = encoder.rnn(first_half)
    assert torch.equal(state_from_flat(state, 2, 4, lstm=True)[0], h)
    assert torch.equal(state_to_flat((h, c)), state)
    decoder.rnn.load_state_dict(encoder.rnn.state_dict())
    continued = decoder({"inputs": second_half, "initial_state": state})
    expected, _ = encoder.rnn(second_half, (h, c))
    assert torch.allclose(continued["outputs"], expected, atol=1e-6)
    whole, _ = encoder.rnn(torch.cat([first_half, second_half], dim=1))
    assert torch.allclose(continued["outputs"], whole[:, 3:], atol=1e-6)


def test_trainable_initial_state_learns_and_frozen_networks_do_not() -> None:
    model = rnn(cell_type="GRU", initial_state="trainable", dropout=0.5, num_layers=2)
    predictions = model({"inputs": torch.randn(2, 3, 5)})["predictions"]
    predictions.sum().backward()
    assert model.learnt_state.grad is not None and model.learnt_state.grad.abs().sum() > 0
    model.freeze()
    model.train()  # a frozen component stays in eval mode: no dropout
    assert not model.training and all(not p.requires_grad for p in model.parameters())
    inputs = torch.randn(2, 3, 5)
    first, second = model({"inputs": inputs}), model({"inputs": inputs})
    assert torch.equal(first["predictions"], second["predictions"])
    assert model.parameter_counts()[0] == 0


def test_dense_predictions_with_the_sequence_loss_and_accuracy() -> None:
    torch.manual_seed(0)
    model = rnn(cell_type="GRU", use_lengths=True)
    inputs, lengths = torch.randn(3, 5, 5), torch.tensor([5, 2, 4])
    predictions = model({"inputs": inputs, "lengths": lengths})["predictions"]
    targets = torch.randint(0, 3, (3, 5))
    targets[torch.arange(5)[None, :] >= lengths[:, None]] = -100  # padding
    loss = NLLLoss.create(sequence=True)({"predictions": predictions, "targets": targets})["loss"]
    kept = targets != -100
    assert torch.allclose(loss, F.nll_loss(predictions[kept], targets[kept]))
    loss.backward()  # the padding gets no gradient, every weight some
    assert all(p.grad is not None for p in model.parameters())


# ---- sequence mode of the losses and of AccuracyStatistics ----------------------------------


def test_sequence_losses_average_over_counted_steps_and_keep_their_spec() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 6, 5, generator=generator)
    targets = torch.randint(0, 5, (4, 6), generator=generator)
    targets[:, 4:] = 0  # <PAD>
    nll = NLLLoss.create(sequence=True, ignore_index=0)
    log_probabilities = torch.log_softmax(logits, dim=-1)
    loss = nll({"predictions": log_probabilities, "targets": targets})["loss"]
    assert torch.allclose(
        loss, F.nll_loss(log_probabilities.transpose(1, 2), targets, ignore_index=0)
    )
    cross_entropy = CrossEntropyLoss.create(sequence=True, ignore_index=0, label_smoothing=0.1)
    loss = cross_entropy({"predictions": logits, "targets": targets})["loss"]
    expected = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=0, label_smoothing=0.1)
    assert torch.allclose(loss, expected)
    assert nll.input_specs()["predictions"].shape_text() == "[batch, -1, classes]"
    assert nll.input_specs()["targets"].shape_text() == "[batch, -1]"
    assert NLLLoss.create().input_specs()["predictions"].shape_text() == "[batch, classes]"


def test_token_accuracy_leaves_padding_out() -> None:
    accuracy = AccuracyStatistics.create(sequence=True, ignore_index=0, globals={"num_classes": 5})
    assert accuracy.input_specs()["predictions"].shape_text() == "[batch, -1, classes]"
    targets = torch.tensor([[3, 4, 1, 0], [2, 1, 0, 0]])
    predicted = torch.tensor([[3, 2, 1, 1], [2, 3, 4, 0]])  # right: 3, 1 | 2 (pads ignored)
    scores = torch.log_softmax(F.one_hot(predicted, 5) * 4.0, dim=-1)
    accuracy.update({"predictions": scores[:1], "targets": targets[:1]})
    accuracy.update({"predictions": scores[1:], "targets": targets[1:]})
    assert accuracy.compute() == {"accuracy": pytest.approx(3 / 5)}


# ---- Seq2Seq and AttentionDecoder --------------------------------------------------------------


def word_sequences(
    size: int, generator: torch.Generator, reverse: bool
) -> tuple[torch.Tensor, ...]:
    """Sources of 3..5 words (3..7, one-hot, padded to 5), and targets that copy or reverse
    them, end with <EOS> and are padded with <PAD> to 6."""
    lengths = torch.randint(3, 6, (size,), generator=generator)
    words = torch.randint(3, VOCABULARY, (size, 5), generator=generator)
    valid = torch.arange(5)[None, :] < lengths[:, None]
    sources = torch.where(valid, words, 0)
    targets = torch.zeros(size, 6, dtype=torch.int64)
    for row, length in enumerate(lengths.tolist()):
        sequence = sources[row, :length]
        targets[row, :length] = sequence.flip(0) if reverse else sequence
        targets[row, length] = 1  # <EOS>
    inputs = F.one_hot(sources, VOCABULARY).float() * valid[..., None]
    return inputs, lengths, targets


Decode = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def train_and_score(
    run: Decode, modules: list[torch.nn.Module], reverse: bool, steps: int
) -> tuple[dict[str, float], dict[str, float]]:
    """(token accuracy and BLEU before training, after training) of a decoder on 300
    held-out sequences, decoding freely (no teacher forcing) in eval mode."""

    def score(modules: list[torch.nn.Module]) -> dict[str, float]:
        for module in modules:
            module.eval()
        inputs, lengths, targets = word_sequences(300, torch.Generator().manual_seed(1), reverse)
        accuracy = AccuracyStatistics.create(
            sequence=True, ignore_index=0, globals={"num_classes": VOCABULARY}
        )
        bleu = BLEUStatistics.create()
        with torch.no_grad():
            predictions = run(inputs, lengths, targets)
        for statistic in (accuracy, bleu):
            statistic.update({"predictions": predictions, "targets": targets})
        for module in modules:
            module.train()
        return accuracy.compute() | bleu.compute()

    before = score(modules)
    optimizer = torch.optim.Adam([p for m in modules for p in m.parameters()], lr=0.01)
    loss = NLLLoss.create(sequence=True, ignore_index=0)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        inputs, lengths, targets = word_sequences(32, generator, reverse)
        value = loss({"predictions": run(inputs, lengths, targets), "targets": targets})["loss"]
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
    return before, score(modules)


@pytest.mark.slow  # a few seconds of training
def test_seq2seq_learns_to_reverse_sequences() -> None:
    torch.manual_seed(0)
    model = Seq2Seq.create(
        hidden_size=64,
        embedding_size=16,
        teacher_forcing_ratio=0.5,
        use_lengths=True,
        globals={"input_size": VOCABULARY, "prediction_size": VOCABULARY},
    )

    def run(inputs: torch.Tensor, lengths: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        outputs = model({"inputs": inputs, "lengths": lengths, "targets": targets})
        check_specs(model, outputs, inputs.shape[0])
        return outputs["predictions"]

    before, after = train_and_score(run, [model], reverse=True, steps=200)
    # Chance is 1/6 (five words and <EOS>); measured 0.93 and BLEU 0.82 after 200 steps.
    assert before["accuracy"] < 0.3 and after["accuracy"] > 0.85
    assert before["bleu"] < 0.1 and after["bleu"] > 0.7


@pytest.mark.slow  # a few seconds of training
def test_attention_decoder_learns_to_copy_sequences() -> None:
    torch.manual_seed(0)
    encoder = RecurrentNeuralNetwork.create(
        cell_type="GRU",
        hidden_size=32,
        bidirectional=True,
        prediction_mode="none",
        use_lengths=True,
        globals={"input_size": VOCABULARY},
    )
    decoder = AttentionDecoder.create(
        hidden_size=64,
        embedding_size=16,
        attention_size=32,
        teacher_forcing_ratio=0.5,
        use_lengths=True,
        output_attention=True,
        globals={"input_size": 64, "prediction_size": VOCABULARY},
    )

    def run(inputs: torch.Tensor, lengths: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        encoded = encoder({"inputs": inputs, "lengths": lengths})["outputs"]
        outputs = decoder({"inputs": encoded, "lengths": lengths, "targets": targets})
        check_specs(decoder, outputs, inputs.shape[0])
        attention = outputs["attention"]
        assert attention.shape == (inputs.shape[0], targets.shape[1], inputs.shape[1])
        assert torch.allclose(attention.sum(-1), torch.ones(attention.shape[:2]), atol=1e-5)
        padding = torch.arange(inputs.shape[1])[None, :] >= lengths[:, None]
        assert attention.masked_select(padding[:, None, :]).abs().sum() == 0
        return outputs["predictions"]

    before, after = train_and_score(run, [encoder, decoder], reverse=False, steps=100)
    # Measured 1.0 and BLEU 1.0 after 100 steps.
    assert before["accuracy"] < 0.3 and after["accuracy"] > 0.95
    assert before["bleu"] < 0.1 and after["bleu"] > 0.9


def decoder_batch() -> Batch:
    inputs, lengths, targets = word_sequences(6, torch.Generator().manual_seed(3), reverse=False)
    return {"inputs": inputs, "lengths": lengths, "targets": targets}


@pytest.mark.parametrize("kind", ["seq2seq", "attention"])
def test_teacher_forcing_draws_from_the_global_generator_and_only_in_training(kind: str) -> None:
    def build(ratio: float) -> Component:
        torch.manual_seed(0)
        if kind == "seq2seq":
            return Seq2Seq.create(
                hidden_size=8,
                teacher_forcing_ratio=ratio,
                globals={"input_size": VOCABULARY, "prediction_size": VOCABULARY},
            )
        return AttentionDecoder.create(
            hidden_size=8,
            teacher_forcing_ratio=ratio,
            globals={"input_size": VOCABULARY, "prediction_size": VOCABULARY},
        )

    batch = decoder_batch()
    model = build(0.5)
    torch.manual_seed(5)
    first = model(batch)["predictions"]
    state = torch.get_rng_state()
    second = model(batch)["predictions"]
    torch.set_rng_state(state)  # what exact resume restores
    assert torch.equal(model(batch)["predictions"], second)
    torch.manual_seed(5)
    assert torch.equal(model(batch)["predictions"], first)
    # Evaluation feeds the decoder its own words: no draw, and the ratio changes nothing.
    model.eval()
    state = torch.get_rng_state()
    evaluated = model(batch)["predictions"]
    assert torch.equal(torch.get_rng_state(), state)
    never = build(0.0).eval()
    assert torch.equal(never(batch)["predictions"], evaluated)


def test_full_teacher_forcing_in_one_call_equals_the_step_by_step_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    globals_ = {"input_size": VOCABULARY, "prediction_size": VOCABULARY}
    torch.manual_seed(0)
    fast = Seq2Seq.create(
        cell_type="LSTM", num_layers=2, teacher_forcing_ratio=1.0, globals=globals_
    )
    looped = Seq2Seq.create(
        cell_type="LSTM", num_layers=2, teacher_forcing_ratio=0.9, globals=globals_
    )
    looped.load_state_dict(fast.state_dict())
    # Every draw says "teacher": the loop then feeds every target, as the one call does.
    monkeypatch.setattr(torch, "rand", lambda size, **options: torch.zeros(size, **options))
    batch = decoder_batch()
    assert torch.allclose(fast(batch)["predictions"], looped(batch)["predictions"], atol=1e-6)


@pytest.mark.parametrize("kind", [Seq2Seq, AttentionDecoder])
def test_a_fixed_autoregression_length_needs_no_targets(kind: type[Component]) -> None:
    model = kind.create(
        autoregression_length=4,
        teacher_forcing_ratio=0.0,
        globals={"input_size": VOCABULARY, "prediction_size": VOCABULARY},
    )
    assert "targets" not in model.input_specs()
    inputs = decoder_batch()["inputs"]
    predictions = model({"inputs": inputs})["predictions"]
    assert predictions.shape == (6, 4, VOCABULARY)


@pytest.mark.parametrize("kind", [Seq2Seq, AttentionDecoder])
def test_impossible_decoder_parameters_are_build_errors(kind: type[Component]) -> None:
    globals_ = {"input_size": VOCABULARY, "prediction_size": VOCABULARY}
    with pytest.raises(ComponentError, match="start_index 8 is not a word"):
        kind.create(name="decoder", start_index=8, globals=globals_)
    with pytest.raises(ComponentError, match=r"teacher_forcing_ratio 0\.5 needs the `targets`"):
        kind.create(name="decoder", autoregression_length=5, globals=globals_)


def test_attention_decoder_initial_states() -> None:
    globals_ = {"input_size": 6, "prediction_size": VOCABULARY, "initial_state_size": 10}
    needed = AttentionDecoder.needed_globals(AttentionDecoder.Params(initial_state="input"))
    assert "initial_state_size" in needed
    assert "initial_state_size" not in AttentionDecoder.needed_globals(AttentionDecoder.Params())
    batch = {"inputs": torch.randn(2, 3, 6), "targets": torch.tensor([[3, 1], [4, 1]])}
    for mode in ("zero", "mean", "input"):
        model = AttentionDecoder.create(initial_state=mode, globals=globals_).eval()
        inputs = batch | {"initial_state": torch.randn(2, 10)}
        assert set(model.input_specs()) == {"inputs", "targets"} | (
            {"initial_state"} if mode == "input" else set()
        )
        check_specs(model, model(inputs), 2)


# ---- SelfAttention and TransformerEncoder ------------------------------------------------------


@pytest.mark.parametrize("kind", ["self_attention", "transformer"])
@pytest.mark.parametrize("pooling", ["none", "mean", "attention"])
def test_padding_changes_nothing(kind: str, pooling: str) -> None:
    torch.manual_seed(0)
    if kind == "self_attention":
        model: Component = SelfAttention.create(
            num_heads=2, residual=True, use_lengths=True, pooling=pooling, globals={"input_size": 8}
        )
    else:
        model = TransformerEncoder.create(
            num_heads=2,
            num_layers=2,
            dim_feedforward=16,
            use_lengths=True,
            pooling=pooling,
            globals={"input_size": 8},
        )
    model.eval()
    inputs, lengths = torch.randn(3, 6, 8), torch.tensor([6, 2, 4])
    together = model({"inputs": inputs, "lengths": lengths})
    check_specs(model, together, 3)
    for row, length in enumerate(lengths.tolist()):
        alone = model({"inputs": inputs[row : row + 1, :length], "lengths": lengths[row : row + 1]})
        expected = together["outputs"][row : row + 1]
        if pooling == "none":
            assert expected[:, length:].abs().sum() == 0
            expected = expected[:, :length]
        assert torch.allclose(alone["outputs"], expected, atol=1e-5)


def test_self_attention_weights_and_mean_pooling() -> None:
    torch.manual_seed(0)
    model = SelfAttention.create(
        num_heads=2, use_lengths=True, output_attention=True, globals={"input_size": 4}
    )
    inputs, lengths = torch.randn(2, 5, 4), torch.tensor([5, 3])
    outputs = model({"inputs": inputs, "lengths": lengths})
    weights = outputs["attention"]
    assert weights.shape == (2, 5, 5)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 5), atol=1e-6)
    assert weights[1, :, 3:].abs().sum() == 0  # padded keys get no attention
    pooled = SelfAttention.create(
        num_heads=2, use_lengths=True, pooling="mean", globals={"input_size": 4}
    )
    pooled.load_state_dict(model.state_dict())
    vectors = pooled({"inputs": inputs, "lengths": lengths})["outputs"]
    assert torch.allclose(vectors[1], outputs["outputs"][1, :3].mean(0), atol=1e-6)
    assert pooled.output_specs()["outputs"].shape_text() == "[batch, 4]"


def test_positions_matter_only_with_a_positional_encoding() -> None:
    inputs = torch.randn(1, 5, 8)
    order = torch.tensor([4, 2, 0, 1, 3])
    for encoding in ("none", "sinusoidal"):
        torch.manual_seed(0)
        model = TransformerEncoder.create(
            num_heads=2, dropout=0.0, positional_encoding=encoding, globals={"input_size": 8}
        ).eval()
        permuted = model({"inputs": inputs[:, order]})["outputs"]
        original = model({"inputs": inputs})["outputs"][:, order]
        assert torch.allclose(permuted, original, atol=1e-5) == (encoding == "none")
    encoding = sinusoidal_encoding(3, 5, torch.device("cpu"))
    assert encoding[2, 0] == pytest.approx(math.sin(2))
    assert encoding[2, 1] == pytest.approx(math.cos(2))
    assert encoding[1, 2] == pytest.approx(math.sin(1 / 10000 ** (2 / 5)))
    assert encoding[1, 3] == pytest.approx(math.cos(1 / 10000 ** (2 / 5)))


@pytest.mark.parametrize("positions", ["sinusoidal", "none"])
def test_transformer_learns_which_word_comes_first_only_with_positions(positions: str) -> None:
    torch.manual_seed(0)
    embed = torch.nn.Linear(4, 16)
    model = TransformerEncoder.create(
        num_heads=2,
        num_layers=1,
        dim_feedforward=32,
        dropout=0.0,
        use_lengths=True,
        pooling="attention",
        positional_encoding=positions,
        globals={"input_size": 16},
    )
    head = torch.nn.Linear(16, 2)
    parameters = [*embed.parameters(), *model.parameters(), *head.parameters()]
    optimizer = torch.optim.Adam(parameters, lr=0.005)

    def classify(inputs: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        pooled = model({"inputs": embed(inputs), "lengths": lengths})["outputs"]
        return torch.log_softmax(head(pooled), dim=1)

    generator = torch.Generator().manual_seed(0)
    for _ in range(150):
        inputs, lengths, labels = first_word_batch(32, generator)
        loss = F.nll_loss(classify(inputs, lengths), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    inputs, lengths, labels = first_word_batch(400, torch.Generator().manual_seed(1))
    with torch.no_grad():
        accuracy = float((classify(inputs, lengths).argmax(1) == labels).float().mean())
    # Measured: 1.0 with positions; 0.455 without (attention is blind to order).
    if positions == "sinusoidal":
        assert accuracy > 0.9
    else:
        assert accuracy < 0.6  # chance: 0.5


@pytest.mark.parametrize("kind", [SelfAttention, TransformerEncoder])
def test_heads_must_divide_the_width(kind: type[Component]) -> None:
    with pytest.raises(ComponentError) as error:
        kind.create(name="attention", num_heads=3, globals={"input_size": 8})
    message = str(error.value)
    assert "num_heads 3 does not divide the input width 8" in message
    assert "'attention'" in message and "1, 2, 4, 8" in message


# ---- in a pipeline ---------------------------------------------------------------------------


class CopyTaskParams(ComponentParams):
    size: int = 256
    seed: int = 0
    reverse: bool = False


class CopyTask(Task):
    """Source words (one-hot, `inputs`), their `lengths`, and `targets` that copy them."""

    Params = CopyTaskParams
    params: CopyTaskParams
    PUBLISHES_GLOBALS = {"input_size": "one-hot width", "vocabulary_size": "words"}

    def __init__(self, params: CopyTaskParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.publish_global("input_size", VOCABULARY)
        self.publish_global("vocabulary_size", VOCABULARY)
        generator = torch.Generator().manual_seed(params.seed)
        self.data = word_sequences(params.size, generator, params.reverse)

    def output_specs(self) -> dict[str, StreamSpec]:
        return {
            "inputs": StreamSpec(("batch", 5, VOCABULARY), torch.float32, "one-hot words"),
            "lengths": StreamSpec(("batch",), torch.int64, "source lengths"),
            "targets": StreamSpec(("batch", 6), torch.int64, "target words"),
        }

    def __len__(self) -> int:
        return self.params.size

    def __getitem__(self, index: int) -> Batch:
        inputs, lengths, targets = self.data
        return {"inputs": inputs[index], "lengths": lengths[index], "targets": targets[index]}


PIPELINE = """
training:
  task: {type: test_zoo_sequence_models:CopyTask, size: 512}
  dataloader: {batch_size: 32, shuffle: true}
  optimizer: {type: Adam, lr: 0.01}
  seed: 0
  terminal_conditions: {epoch_limit: 3}
validation:
  task: {type: test_zoo_sequence_models:CopyTask, size: 128, seed: 1}
pipeline:
  encoder:
    type: RecurrentNeuralNetwork
    cell_type: GRU
    hidden_size: 32
    bidirectional: true
    prediction_mode: none
    use_lengths: true
    streams: {outputs: encoder_outputs, final_state: encoder_state}
  decoder:
    type: AttentionDecoder
    hidden_size: 64
    embedding_size: 16
    attention_size: 32
    initial_state: input
    use_lengths: true
    streams: {inputs: encoder_outputs, initial_state: encoder_state}
    globals: {input_size: rnn_hidden_size, initial_state_size: rnn_state_size,
              prediction_size: vocabulary_size}
  loss: {type: NLLLoss, sequence: true, ignore_index: 0}
  word_accuracy:
    type: AccuracyStatistics
    sequence: true
    ignore_index: 0
    globals: {num_classes: vocabulary_size}
  bleu: {type: BLEUStatistics}
"""


@pytest.mark.slow  # a few seconds of training
def test_an_encoder_attention_decoder_pipeline_checks_and_trains(tmp_path: Path) -> None:
    import torchloom

    config = tmp_path / "copy.yml"
    config.write_text(PIPELINE, encoding="utf-8")
    assert main(["check", str(config)]) == 0
    result = torchloom.train(str(config), expdir=str(tmp_path / "runs"), analysis=False)
    validation = result.statistics["validation"]
    # Measured: word accuracy 1.0, BLEU 1.0 after 3 epochs of 16 batches.
    assert validation["accuracy"] > 0.9 and validation["bleu"] > 0.8
    wrong = ["check", str(config), "pipeline.word_accuracy.sequence=false"]
    assert main(wrong) == 2  # the handshake sees rank-3 predictions for a rank-2 input


class FP16UnderAutocast(torch.nn.Module):
    """A recurrent layer as torch's autocast runs cuDNN's on a GPU: in fp16, whatever
    autocast's dtype (aten/src/ATen/cudnn/AutocastRNN.cpp casts to Half); as it is without."""

    def __init__(self, layer: torch.nn.RNNBase) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, inputs: Any, state: Any) -> Any:
        outputs, final = self.layer(inputs, state)
        if not torch.is_autocast_enabled("cpu"):
            return outputs, final
        if isinstance(final, tuple):
            return outputs.half(), tuple(part.half() for part in final)
        return outputs.half(), final.half()


@pytest.mark.parametrize("use_lengths", [False, True])
def test_recurrent_layers_run_in_float32_under_bf16_autocast(use_lengths: bool) -> None:
    """Under bf16 autocast a GPU's recurrent layers would give fp16 (made so here), which
    autocast refuses to mix with bf16 (the final state's `cat`) and which has no gradient
    scaler: they run in float32 with autocast off, and the model trains."""
    model = rnn(cell_type="LSTM", bidirectional=True, use_lengths=use_lengths)
    model.rnn = FP16UnderAutocast(model.rnn)  # type: ignore[assignment]
    batch = {"inputs": torch.randn(3, 6, 5), "lengths": torch.tensor([6, 2, 4])}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(batch)
    assert out["outputs"].dtype == torch.float32 and out["final_state"].dtype == torch.float32
    out["predictions"].float().sum().backward()
    assert all(
        p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in model.rnn.parameters()
    )
    seq2seq = Seq2Seq.create(
        cell_type="GRU", globals={"input_size": VOCABULARY, "prediction_size": VOCABULARY}
    )
    seq2seq.decoder = FP16UnderAutocast(seq2seq.decoder)  # type: ignore[assignment]
    seq2seq.encoder = FP16UnderAutocast(seq2seq.encoder)  # type: ignore[assignment]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        predictions = seq2seq(decoder_batch())["predictions"]
    assert bool(torch.isfinite(predictions).all())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("cell_type", ["LSTM", "GRU"])
def test_recurrent_models_train_under_cuda_bf16_autocast(cell_type: str) -> None:
    """The same on a GPU, where cuDNN's recurrent layers are what autocast casts to fp16."""
    model = rnn(cell_type=cell_type, bidirectional=True, use_lengths=True).cuda()
    batch = {
        "inputs": torch.randn(3, 6, 5, device="cuda"),
        "lengths": torch.tensor([6, 2, 4], device="cuda"),
    }
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(batch)
    out["predictions"].float().sum().backward()
    assert out["final_state"].dtype == torch.float32
    assert all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("kind", [Seq2Seq, AttentionDecoder])
def test_a_compiled_decoder_compiles_once_whatever_the_target_length(
    kind: type[Component],
) -> None:
    """torch.compile unrolls the decoding loop and specialises on its length: a decoder
    compiled whole compiled again for every new target length, and after 8 ran eagerly.
    Compiled, the decoder compiles its step alone; its outputs stay the eager ones, and a deep
    copy (as quantization makes) steps with its own weights."""
    import copy

    import torch._dynamo

    torch.manual_seed(0)
    model = kind.create(
        hidden_size=8,
        teacher_forcing_ratio=0.5,
        globals={"input_size": VOCABULARY, "prediction_size": VOCABULARY},
    )
    batch = decoder_batch()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model.compile(backend="eager")

    def outputs(model: Component, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        targets = torch.randint(1, VOCABULARY, (6, length), generator=torch.Generator())
        torch.manual_seed(length)
        compiled = model(batch | {"targets": targets})["predictions"]
        torch.manual_seed(length)
        with torch.compiler.set_stance("force_eager"):
            eager = model(batch | {"targets": targets})["predictions"]
        return compiled, eager

    try:
        for length in (3, 4):
            outputs(model, length)
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        assert graphs > 0  # the step was compiled
        for length in range(5, 15):
            compiled, eager = outputs(model, length)
            assert compiled.shape[1] == length
            assert torch.equal(compiled, eager), length
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
        twin = copy.deepcopy(model)
        with torch.no_grad():
            for weight in twin.parameters():
                weight.mul_(-1.5)
        compiled, eager = outputs(twin, 5)
        assert torch.equal(compiled, eager)
        assert not torch.equal(compiled, outputs(model, 5)[0])
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("kind", [NLLLoss, CrossEntropyLoss])
def test_a_batch_whose_targets_are_all_ignored_has_a_zero_loss_not_nan(kind: type) -> None:
    """torch's mean over no target is NaN: a masked head's batch stopped training as
    diverged ("lower the learning rate"). Over counted targets, the mean is torch's."""
    predictions = torch.log_softmax(torch.randn(2, 3, 4, requires_grad=True), dim=-1)
    loss = kind.create(sequence=True, ignore_index=0)
    ignored = loss({"predictions": predictions, "targets": torch.zeros(2, 3, dtype=torch.int64)})
    assert ignored["loss"].item() == 0.0
    ignored["loss"].backward()  # a graph, with zero gradients
    targets = torch.tensor([[1, 2, 0], [3, 0, 0]])
    counted = loss({"predictions": predictions, "targets": targets})["loss"]
    expected = F.nll_loss(predictions.reshape(-1, 4), targets.reshape(-1), ignore_index=0)
    assert counted.item() == pytest.approx(expected.item(), rel=1e-6)
