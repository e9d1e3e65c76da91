"""NLLLoss and CrossEntropyLoss equal torch.nn.functional on the same inputs."""

from __future__ import annotations

import pydantic
import pytest
import torch
import torch.nn.functional as F

from torchloom.zoo.losses import CrossEntropyLoss, NLLLoss


def predictions_and_targets() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 5, generator=generator, requires_grad=True)
    targets = torch.randint(0, 5, (8,), generator=generator)
    return logits, targets


def test_nll_loss_equals_functional_and_matches_its_spec() -> None:
    logits, targets = predictions_and_targets()
    log_probabilities = torch.log_softmax(logits, dim=1)
    loss_component = NLLLoss.create()
    loss = loss_component({"predictions": log_probabilities, "targets": targets})["loss"]
    assert torch.equal(loss, F.nll_loss(log_probabilities, targets))
    spec = loss_component.output_specs()["loss"]
    assert spec.dims == () and spec.dtypes is not None and loss.dtype in spec.dtypes
    loss.backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_nll_loss_ignore_index() -> None:
    logits, targets = predictions_and_targets()
    targets[:3] = 3
    log_probabilities = torch.log_softmax(logits, dim=1)
    loss = NLLLoss.create(ignore_index=3)({"predictions": log_probabilities, "targets": targets})
    kept = targets != 3
    expected = F.nll_loss(log_probabilities[kept], targets[kept])
    assert torch.allclose(loss["loss"], expected)


@pytest.mark.parametrize(("smoothing", "ignore_index"), [(0.0, -100), (0.1, 2)])
def test_cross_entropy_equals_functional(smoothing: float, ignore_index: int) -> None:
    logits, targets = predictions_and_targets()
    loss_component = CrossEntropyLoss.create(label_smoothing=smoothing, ignore_index=ignore_index)
    loss = loss_component({"predictions": logits, "targets": targets})["loss"]
    expected = F.cross_entropy(
        logits, targets, ignore_index=ignore_index, label_smoothing=smoothing
    )
    assert torch.equal(loss, expected)


def test_half_precision_predictions_give_a_float32_loss() -> None:
    logits, targets = predictions_and_targets()
    loss = CrossEntropyLoss.create()({"predictions": logits.bfloat16(), "targets": targets})
    assert loss["loss"].dtype == torch.float32
    assert torch.allclose(loss["loss"], F.cross_entropy(logits, targets), atol=2e-2)


def test_label_smoothing_must_be_below_one() -> None:
    with pytest.raises(pydantic.ValidationError, match="label_smoothing"):
        CrossEntropyLoss.create(label_smoothing=1.0)
