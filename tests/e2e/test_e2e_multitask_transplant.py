"""The multi-task and transplant pipelines, trained end to end on small subsets of real MNIST:
two heads on one shared encoder each learn their own targets; an encoder trained and saved by
one pipeline is loaded, frozen and kept unchanged by another, whose new head learns."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from e2e_helpers import weights

import torchloom
from torchloom.cli.main import main
from torchloom.errors import ComponentError
from torchloom.zoo.target_mapping import TargetMapping

CONFIGS = Path(__file__).resolve().parents[2] / "src" / "torchloom" / "configs"
MULTITASK = CONFIGS / "multitask" / "mnist_shared_encoder_two_heads.yml"
TRAIN_ENCODER = CONFIGS / "transplant" / "mnist_train_encoder.yml"
TRANSPLANT = CONFIGS / "transplant" / "mnist_transplant_encoder.yml"


def short_run(data: Path, train: int = 2048) -> list[str]:
    """One epoch on a subset of the training images; a smaller validation set, no test."""
    return [
        f"training.task.data_folder={data}",
        f"+training.task.subset={train}",
        "+validation.task.subset=512",
        "~test",
        "training.terminal_conditions.epoch_limit=1",
        "++training.seed=3",
    ]


def test_target_mapping_derives_a_second_labelling() -> None:
    parity = TargetMapping.create(mapping=[0, 1] * 5, globals={"num_classes": 10})
    assert parity._context.store.get("num_mapped_classes", "test", "") == 2
    targets = torch.tensor([0, 7, 4, -100, 9])
    mapped = parity({"targets": targets})["mapped_targets"]
    assert mapped.tolist() == [0, 1, 0, -100, 1]  # the ignore index passes through
    assert mapped.dtype == torch.int64 and parity.state_dict() == {}


@pytest.mark.parametrize(
    ("mapping", "text"),
    [
        ([0, 1, 0], "has 3 entries but the targets have 10 classes"),
        ([0] * 5 + [2] * 5, "never maps to class 1"),
    ],
)
def test_target_mapping_rejects_a_table_that_does_not_fit(mapping: list[int], text: str) -> None:
    with pytest.raises(ComponentError, match=text) as error:
        TargetMapping.create(name="parity", mapping=mapping, globals={"num_classes": 10})
    assert "'parity' (TargetMapping)" in str(error.value)


def test_multitask_config_passes_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(MULTITASK)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "handshake: ok" in out and "num_parity_classes=2" in out


def test_transplant_config_asks_for_the_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", str(TRAIN_ENCODER)]) == 0
    assert main(["check", str(TRANSPLANT)]) == 2
    assert "pipeline.image_encoder.load.file=VALUE" in capsys.readouterr().err
    missing = tmp_path / "best.pt"
    assert main(["check", str(TRANSPLANT), f"pipeline.image_encoder.load.file={missing}"]) == 2
    assert f"weights file '{missing}' does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_two_heads_on_a_shared_encoder_learn_their_own_targets(
    tmp_path: Path, mnist_folder: Path
) -> None:
    result = torchloom.train(MULTITASK, short_run(mnist_folder), expdir=str(tmp_path / "runs"))
    validation = result.statistics["validation"]
    # Each head has its own accuracy and each loss is reported on its own.
    assert validation["digit_accuracy.accuracy"] > 0.6  # 10 classes: chance is 0.1
    assert validation["parity_accuracy.accuracy"] > 0.75  # 2 classes: chance is about 0.5
    assert {"digit_loss", "parity_loss", "loss"} <= validation.keys()
    # The total loss is the weighted sum 1.0 * digit + 0.5 * parity.
    expected = validation["digit_loss"] + 0.5 * validation["parity_loss"]
    assert validation["loss"] == pytest.approx(expected, rel=1e-4)
    # One encoder, trained by both losses, and two heads of their own sizes.
    state = weights(result.run_dir)
    assert state["digit_head"]["layers.3.weight"].shape == (10, 128)  # after its dropout
    assert state["parity_head"]["layers.2.weight"].shape == (2, 64)


@pytest.mark.slow
def test_transplanted_encoder_is_loaded_frozen_and_a_new_head_learns_on_it(
    tmp_path: Path, mnist_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expdir = str(tmp_path / "runs")
    first = torchloom.train(TRAIN_ENCODER, short_run(mnist_folder), expdir=expdir)
    checkpoint = first.run_dir / "checkpoints" / "best.pt"
    trained = weights(first.run_dir, "best.pt")["image_encoder"]

    load = f"pipeline.image_encoder.load.file={checkpoint}"
    assert main(["check", str(TRANSPLANT), load]) == 0
    out = capsys.readouterr().out
    assert "frozen" in out and "handshake: ok" in out

    second = torchloom.train(TRANSPLANT, [load, *short_run(mnist_folder)], expdir=expdir)
    after = weights(second.run_dir)  # last.pt: the state at the end of training
    assert "classifier" not in after and "new_head" in after
    # The encoder is the trained one, bit for bit, and training left it unchanged.
    assert after["image_encoder"].keys() == trained.keys()
    for key, tensor in trained.items():
        assert torch.equal(after["image_encoder"][key], tensor), key
    # The new head learned on the transplanted features: 10 classes, chance is 0.1.
    assert second.statistics["validation"]["accuracy"] > 0.7
