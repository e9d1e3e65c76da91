"""Drop-path raised linearly over the epochs (the DARTS reference's train.py:
`drop_path_prob * epoch / epochs`): the probability each training step of a real run uses,
epoch by epoch, on a fresh run and on one stopped mid-epoch and resumed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from torchloom.engine.state import Hook, RunView
from torchloom.engine.trainer import TrainingLoop
from torchloom.zoo.nas.fixed_network import DartsFixedNetwork
from torchloom.zoo.nas.operations import drop_path_at
from toy_runs import StopAt, only_run, start, train

GENOTYPE = """{normal: [[sep_conv_3x3, 0], [skip_connect, 1], [max_pool_3x3, 0], [dil_conv_3x3, 2]],
                normal_concat: [2, 3],
                reduce: [[max_pool_3x3, 0], [sep_conv_3x3, 1], [skip_connect, 2],
                         [avg_pool_3x3, 1]],
                reduce_concat: [2, 3]}"""


def fixed_config(folder: Path, epochs: int, ramp: str) -> Path:
    data = folder / "mnist"
    text = f"""\
name: drop_path_ramp
training:
  task: {{type: MNIST, split: train, data_folder: {data}, subset: 48,
          transforms: {{resize: [16, 16]}}}}
  dataloader: {{batch_size: 16}}
  optimizer: {{type: SGD, lr: 0.01}}
  seed: 5
  terminal_conditions: {{epoch_limit: {epochs}}}
pipeline:
  image_classifier:
    type: DartsFixedNetwork
    cells: 3
    channels: 4
    drop_path: 0.3
    drop_path_epochs: {ramp}
    genotype: {GENOTYPE}
    globals: {{prediction_size: num_classes}}
  loss: {{type: CrossEntropyLoss}}
"""
    path = folder / "fixed.yml"
    path.write_text(text, encoding="utf-8")
    return path


class Recorder(Hook):
    """The drop-path probability of every training step, by epoch."""

    name = "drop_path_recorder"

    def __init__(self) -> None:
        self.seen: dict[int, set[float]] = {}

    def after_step(self, run: RunView, batch: Any, loss: torch.Tensor) -> None:
        network = run.pipeline.components["image_classifier"]
        assert isinstance(network, DartsFixedNetwork)
        epoch = run.progress.epoch  # completed epochs: this step's epoch
        self.seen.setdefault(epoch, set()).add(round(network.drop_probability, 6))


def test_the_ramp_formula() -> None:
    assert [drop_path_at(0.2, 4, e) for e in range(6)] == pytest.approx(
        [0.0, 0.05, 0.1, 0.15, 0.2, 0.2]
    )
    assert drop_path_at(0.2, None, 0) == 0.2  # no ramp: constant


def test_each_epoch_trains_with_its_share_of_the_top(tmp_path: Path) -> None:
    """Over the whole training (the paper's), written as the epoch limit's interpolation."""
    recorder = Recorder()
    config = fixed_config(tmp_path, 4, '"${training.terminal_conditions.epoch_limit}"')
    train(config, tmp_path / "runs", recorder)
    assert recorder.seen == {0: {0.0}, 1: {0.075}, 2: {0.15}, 3: {0.225}}


def test_a_resumed_run_continues_the_ramp_where_it_stopped(tmp_path: Path) -> None:
    config = fixed_config(tmp_path, 4, "2")
    expdir = tmp_path / "runs"
    first = Recorder()
    train(config, expdir, first, StopAt(5))  # 3 steps an epoch: stops in epoch 1 (0-based)
    assert first.seen == {0: {0.0}, 1: {0.15}}
    resumed = Recorder()
    loop = start(None, expdir, resumed, resume=only_run(expdir))
    assert isinstance(loop, TrainingLoop)
    loop.run()
    assert resumed.seen == {1: {0.15}, 2: {0.3}, 3: {0.3}}  # the top after the ramp


def test_a_compiled_network_compiles_once_however_the_ramp_moves() -> None:
    """The probability was a Python number that dynamo compiled as a constant: every epoch
    of a ramp compiled the network again, and after eight torch.compile gave up and it ran
    eagerly ("hit config.recompile_limit"). It is a buffer now; only whether anything is
    dropped (not in a ramp's first epoch) tells two graphs apart."""
    import torch._dynamo

    from torchloom.zoo.nas.fixed_network import DartsFixedNetwork

    genotype = {
        "normal": [
            ["sep_conv_3x3", 0],
            ["skip_connect", 1],
            ["max_pool_3x3", 0],
            ["sep_conv_3x3", 2],
        ],
        "normal_concat": [2, 3],
        "reduce": [
            ["max_pool_3x3", 0],
            ["sep_conv_3x3", 1],
            ["skip_connect", 2],
            ["avg_pool_3x3", 0],
        ],
        "reduce_concat": [2, 3],
    }
    globals_ = {"input_depth": 1, "input_height": 8, "input_width": 8, "prediction_size": 3}
    network = DartsFixedNetwork.create(
        cells=3, channels=4, genotype=genotype, drop_path=0.3, drop_path_epochs=11, globals=globals_
    )
    network.train()
    calls: list[object] = []  # a module's hooks (layer statistics') never see the drop
    network.scheduled_drop_path.register_forward_hook(lambda *args: calls.append(args))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    network.compile(backend="eager")
    images = torch.randn(4, 1, 8, 8)
    for epoch in range(12):
        network.start_epoch(epoch)
        torch.manual_seed(epoch)
        compiled = network({"inputs": images})["predictions"]
        torch.manual_seed(epoch)
        eager = network.forward({"inputs": images})["predictions"]  # forward: not compiled
        assert torch.equal(compiled, eager), epoch  # this epoch's probability, not a stale one
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 2
    assert calls == []
    torch._dynamo.reset()
