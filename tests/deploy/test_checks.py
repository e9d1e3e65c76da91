"""The output checks of every export route (ONNX, torch.export, AOTInductor): one helper,
`measure.largest_difference`, which a NaN or an infinity can never pass and which never
broadcasts shapes."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from torchloom.deploy import aoti, onnx_export
from torchloom.deploy.measure import largest_difference
from torchloom.errors import DeployError


def test_largest_difference_is_the_largest_absolute_difference() -> None:
    reference = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    shifted = reference.numpy() + np.array([[0, 0.5], [-2, 0]], dtype=np.float32)
    assert largest_difference(reference, shifted, "x") == 2.0
    assert largest_difference(torch.zeros(0, 3), np.zeros((0, 3)), "x") == 0.0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("side", ["reference", "candidate", "both"])
def test_largest_difference_of_values_not_finite_is_infinite(bad: float, side: str) -> None:
    reference = torch.ones(2, 3)
    candidate = reference.clone()
    if side in ("reference", "both"):
        reference[1, 2] = bad
    if side in ("candidate", "both"):
        candidate[1, 2] = bad
    found = largest_difference(reference, candidate.numpy(), "x")
    assert found == math.inf
    assert not found <= 1e-4  # what every route compares with its tolerance
    assert max(0.0, found) == math.inf  # and what it takes the worst of


def test_largest_difference_refuses_shapes_that_would_broadcast() -> None:
    with pytest.raises(DeployError) as caught:
        largest_difference(torch.ones(4, 10), torch.ones(1, 10), "ONNX check")
    assert "ONNX check" in str(caught.value) and "(1, 10)" in str(caught.value)


class DoublingGraph:
    """A stand-in for an InferenceGraph: one input, one output (twice the input)."""

    input_names = ("images",)
    output_names = ("predictions",)

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (inputs[0] * 2,)


def nan_at_one(inputs: Any) -> np.ndarray:
    values = np.asarray(inputs, dtype=np.float32) * 2
    values[0, 0] = np.nan
    return values


def test_onnx_check_does_not_pass_a_nan() -> None:
    class Session:
        def run(self, names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
            return [nan_at_one(feed["images"])]

    batches = [(torch.ones(4, 3),)]
    assert onnx_export.max_difference(DoublingGraph(), Session(), batches) == math.inf  # type: ignore[arg-type]


def test_onnx_check_refuses_a_broadcastable_shape() -> None:
    class Session:
        def run(self, names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
            return [feed["images"][:1] * 2]

    with pytest.raises(DeployError, match="ONNX check"):
        onnx_export.max_difference(DoublingGraph(), Session(), [(torch.ones(4, 3),)])  # type: ignore[arg-type]


def test_aoti_check_does_not_pass_a_nan(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(aoti.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", lambda *a, **k: None)
    monkeypatch.setattr(
        torch._inductor,
        "aoti_load_package",
        lambda path: lambda x: (torch.from_numpy(nan_at_one(x)),),
    )
    with pytest.raises(DeployError) as caught:
        aoti.aoti_package(None, DoublingGraph(), [(torch.ones(4, 3),)], tmp_path / "p.pt2", 1, (1,))  # type: ignore[arg-type]
    assert "AOTInductor check" in str(caught.value) and "inf" in str(caught.value)
