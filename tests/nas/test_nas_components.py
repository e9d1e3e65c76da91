"""DARTS components: the searchable and the fixed network, genotype derivation and the
genotype's errors at `loom check`, the published DARTS V2 network's size."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torchloom.cli.main import main
from torchloom.config import load_config
from torchloom.engine.assemble import build_checked
from torchloom.zoo.nas.fixed_network import DartsFixedNetwork
from torchloom.zoo.nas.genotype import derive
from torchloom.zoo.nas.operations import PRIMITIVES
from torchloom.zoo.nas.search_network import DartsNetwork

REPO = Path(__file__).resolve().parents[2]
GLOBALS = {"input_depth": 1, "input_height": 8, "input_width": 8, "prediction_size": 3}
SMALL_GENOTYPE = {
    "normal": [["sep_conv_3x3", 0], ["skip_connect", 1], ["sep_conv_3x3", 1], ["dil_conv_3x3", 2]],
    "normal_concat": [2, 3],
    "reduce": [["max_pool_3x3", 0], ["max_pool_3x3", 1], ["skip_connect", 2], ["avg_pool_3x3", 1]],
    "reduce_concat": [2, 3],
}


def test_search_network_runs_and_keeps_alphas_out_of_the_weights() -> None:
    net = DartsNetwork.create(cells=3, channels=4, steps=2, multiplier=2, globals=GLOBALS)
    assert isinstance(net, DartsNetwork)
    out = net({"inputs": torch.randn(2, 1, 8, 8)})["predictions"]
    assert out.shape == (2, 3)
    assert net.alpha_normal.shape == (5, len(PRIMITIVES))  # 2 + 3 edges
    trainable = {id(p) for p in net.parameters() if p.requires_grad}
    assert not trainable & {id(a) for a in net.architecture_parameters()}
    assert "alpha_normal" in net.state_dict()  # checkpoints carry them
    # BatchNorm without affine parameters during the search
    norms = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert all(not m.affine for m in norms if m is not net.stem[1])


def test_genotype_keeps_the_two_strongest_non_none_edges_from_distinct_predecessors() -> None:
    steps, none = 2, PRIMITIVES.index("none")
    alpha = torch.zeros(5, len(PRIMITIVES))
    alpha[:, none] = 10.0  # `none` is never chosen, however strong
    alpha[0, PRIMITIVES.index("sep_conv_3x3")] = 3.0  # node 2 <- 0
    alpha[1, PRIMITIVES.index("max_pool_3x3")] = 2.0  # node 2 <- 1
    alpha[2, PRIMITIVES.index("dil_conv_5x5")] = 1.0  # node 3 <- 0 (weakest of node 3)
    alpha[3, PRIMITIVES.index("skip_connect")] = 4.0  # node 3 <- 1
    alpha[4, PRIMITIVES.index("avg_pool_3x3")] = 5.0  # node 3 <- 2
    genotype = derive(alpha, alpha, steps, multiplier=2)
    assert genotype.normal == [
        ("sep_conv_3x3", 0),
        ("max_pool_3x3", 1),
        ("skip_connect", 1),
        ("avg_pool_3x3", 2),
    ]
    assert genotype.normal_concat == [2, 3]


def test_a_derived_network_concatenates_the_nodes_the_searched_one_did() -> None:
    """With multiplier < steps a searched cell outputs its last `multiplier` nodes; the
    genotype said every node, so the derived network was another, wider one."""
    search = DartsNetwork.create(cells=3, channels=4, steps=3, multiplier=2, globals=GLOBALS)
    genotype = search.genotype()
    assert genotype.normal_concat == genotype.reduce_concat == [3, 4]
    fixed = DartsFixedNetwork.create(
        cells=3, channels=4, genotype=genotype.yaml_data(), globals=GLOBALS
    )
    assert fixed.classifier.in_features == search.classifier.in_features


def test_fixed_network_with_auxiliary_head_and_drop_path() -> None:
    net = DartsFixedNetwork.create(
        cells=3, channels=4, genotype=SMALL_GENOTYPE, auxiliary=True, drop_path=0.3, globals=GLOBALS
    )
    out = net({"inputs": torch.randn(4, 1, 8, 8)})
    assert out["predictions"].shape == out["auxiliary_predictions"].shape == (4, 3)
    assert "auxiliary_predictions" in net.output_specs()
    net.eval()
    x = torch.randn(2, 1, 8, 8)
    assert torch.equal(net({"inputs": x})["predictions"], net({"inputs": x})["predictions"])


def test_darts_v2_config_checks_and_has_the_published_size() -> None:
    config = REPO / "configs" / "nas" / "darts_v2_cifar10.yml"
    assert main(["check", str(config)]) == 0
    pipeline = build_checked(load_config(config), ())
    net = pipeline.components["image_classifier"]
    assert isinstance(net, DartsFixedNetwork)
    # The paper's 3.3 M (its code counts 3.349342 MB of weights, the auxiliary head left out).
    assert net.weight_count() == 3_349_342


def _check(tmp_path: Path, capsys: pytest.CaptureFixture[str], entry: str) -> tuple[int, str]:
    config = tmp_path / "bad.yml"
    config.write_text(
        f"""\
training:
  task: {{type: MNIST, split: train, data_folder: {tmp_path}, download: false}}
  terminal_conditions: {{epoch_limit: 1}}
pipeline:
  image_classifier:
{entry}
    globals: {{prediction_size: num_classes}}
  loss: {{type: CrossEntropyLoss}}
""",
        encoding="utf-8",
    )
    status = main(["check", str(config)])
    return status, capsys.readouterr().err


GENOTYPE_LINES = """\
    type: DartsFixedNetwork
    cells: 3
    channels: 4
    genotype:
      normal: [[sep_conv_3x3, 0], [skip_connect, 1], [sep_conv_3x3, 1], [dil_conv_3x3, 2]]
      normal_concat: [2, 3]
      reduce: [[max_pool_3x3, 0], [max_pool_3x3, 1], [skip_connect, 2], [max_pool_3x3, 1]]
      reduce_concat: [2, 3]"""


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("[sep_conv_3x3, 1], [dil", "[sep_conv_3x4, 1], [dil"), "did you mean 'sep_conv_3x3'"),
        (("[dil_conv_3x3, 2]", "[dil_conv_3x3, 3]"), "wires node 3 to node 3"),
        (("cells: 3", "cells: 2"), "2 reduction cells do not fit 2 cells"),
    ],
    ids=["unknown-primitive", "later-node", "reductions"],
)
def test_genotype_errors_at_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: tuple[str, str], expected: str
) -> None:
    status, err = _check(tmp_path, capsys, GENOTYPE_LINES.replace(*change))
    assert status == 2, err
    assert expected in err
    assert "bad.yml:" in err  # file:line


@pytest.mark.parametrize(
    ("search", "model", "expected"),
    [
        ("{split: 1}", "DartsNetwork", "split.yml:4"),
        ("{split: 0}", "DartsNetwork", "split.yml:4"),
        ("{order: third}", "DartsNetwork", "split.yml:4"),
        ("{arch_optimizer: {type: Adamm}}", "DartsNetwork", "did you mean 'Adam'"),
        ("{}", "LeNet5", "needs a searchable component"),
        ("{derived: {channls: 8}}", "DartsNetwork", "did you mean 'channels'"),
    ],
    ids=["split-1", "split-0", "order", "arch-optimizer", "nothing-to-search", "derived"],
)
def test_bad_architecture_search_settings_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], search: str, model: str, expected: str
) -> None:
    config = tmp_path / "split.yml"
    config.write_text(
        f"""\
training:
  task: {{type: MNIST, split: train, data_folder: {tmp_path}, download: false}}
  terminal_conditions: {{epoch_limit: 1}}
  architecture_search: {search}
pipeline:
  image_classifier:
    {{type: {model}, globals: {{prediction_size: num_classes}}}}
  loss: {{type: CrossEntropyLoss}}
""",
        encoding="utf-8",
    )
    assert main(["check", str(config)]) == 2
    assert expected in capsys.readouterr().err


@pytest.mark.parametrize("size", [2, 3, 4, 5, 6, 7, 9, 14])
def test_the_auxiliary_head_pools_without_adaptive_pooling(size: int) -> None:
    """Adaptive pooling's backward has no deterministic version on a GPU, so a network whose
    last map was not 8x8 (MNIST's 7x7) failed at its first step under
    `training.deterministic`. The map is pooled to the same 2x2 by a plain average pool."""
    from torchloom.zoo.nas.fixed_network import AuxiliaryHead

    head = AuxiliaryHead(channels=4, size=size, classes=3)
    maps = torch.randn(2, 4, size, size, requires_grad=True)
    pooled = head[1](torch.relu(maps))
    expected = torch.nn.functional.adaptive_avg_pool2d(torch.relu(maps), 2)
    assert torch.allclose(pooled, expected, atol=1e-6)
    assert type(pooled.grad_fn).__name__ == "AvgPool2DBackward0"
