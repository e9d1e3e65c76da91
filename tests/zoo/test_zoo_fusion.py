"""Fusion components: shapes against specs, values against hand computations, MCB's count
sketch against its definition, and that every fusion learns an interaction of its two
inputs that concatenation followed by a linear layer cannot."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torchloom.core.component import Component
from torchloom.core.streams import StreamSpec
from torchloom.errors import ComponentError
from torchloom.zoo.models.bilinear_pooling import (
    CompactBilinearPooling,
    FactorizedBilinearPooling,
    LowRankBilinearPooling,
    count_sketch,
    signed_sqrt_l2,
)
from torchloom.zoo.models.fusion import Concatenation
from torchloom.zoo.models.question_driven_attention import QuestionDrivenAttention

SIZES = {"image_features_size": 6, "question_features_size": 4}


def assert_matches(value: torch.Tensor, spec: StreamSpec, known: dict[int, int]) -> None:
    """Shape and dtype against a spec; `known` gives the sizes of free (-1) dimensions."""
    assert spec.dims is not None and spec.dtypes is not None
    assert value.dtype in spec.dtypes
    assert value.ndim == len(spec.dims)
    for axis, dim in enumerate(spec.dims):
        expected = value.shape[0] if dim.name == "batch" else dim.size
        assert value.shape[axis] == (expected if expected is not None else known[axis])


def run(component: Component, batch: dict[str, torch.Tensor], **free: int) -> dict[str, Any]:
    known = {int(axis): size for axis, size in free.items()} if free else {}
    for key, spec in component.input_specs().items():
        assert_matches(batch[key], spec, known)
    outputs = component(batch)
    assert outputs.keys() == component.output_specs().keys()
    for key, spec in component.output_specs().items():
        assert_matches(outputs[key], spec, {2: 3, 3: 5} if key == "attention" else {})
    return dict(outputs)


def two_inputs(batch: int = 5, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "image_features": torch.randn(batch, 6, generator=generator, requires_grad=True),
        "question_features": torch.randn(batch, 4, generator=generator, requires_grad=True),
    }


def assert_gradients_flow(component: Component, batch: dict[str, torch.Tensor]) -> None:
    component.zero_grad()
    component(batch)["outputs"].sin().sum().backward()
    for name, parameter in component.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
    for key, tensor in batch.items():
        assert tensor.grad is not None and torch.isfinite(tensor.grad).all(), key
        assert tensor.grad.abs().sum() > 0, key


FUSIONS: list[tuple[type[Component], dict[str, Any], int]] = [
    (Concatenation, {}, 10),
    (LowRankBilinearPooling, {"latent_size": 8}, 8),
    (LowRankBilinearPooling, {"latent_size": 8, "output_size": 3, "dropout": 0.5}, 3),
    (CompactBilinearPooling, {"output_size": 32}, 32),
    (CompactBilinearPooling, {"output_size": 33, "normalize": False}, 33),
    (FactorizedBilinearPooling, {"factor": 3, "output_size": 7}, 7),
    (FactorizedBilinearPooling, {"factor": 1, "output_size": 2, "normalize": False}, 2),
]


@pytest.mark.parametrize(("cls", "params", "size"), FUSIONS)
def test_fusions_match_their_specs_publish_their_size_and_pass_gradients(
    cls: type[Component], params: dict[str, Any], size: int
) -> None:
    torch.manual_seed(0)
    fusion = cls.create(globals=SIZES, **params)
    assert fusion._context.store.get("output_size", "test", "") == size
    outputs = run(fusion, two_inputs())
    assert outputs["outputs"].shape == (5, size)
    assert_gradients_flow(fusion, two_inputs())


def test_concatenation_reads_sizes_from_globals_named_after_its_streams() -> None:
    fusion = Concatenation.create(
        input_streams=["a", "b", "c"], globals={"a_size": 2, "b_size": 3, "c_size": 1}
    )
    assert set(Concatenation.needed_globals(fusion.params)) == {"a_size", "b_size", "c_size"}
    a, b, c = torch.randn(4, 2), torch.randn(4, 3), torch.randn(4, 1)
    outputs = run(fusion, {"a": a, "b": b, "c": c})
    assert torch.equal(outputs["outputs"], torch.cat([a, b, c], dim=1))


def test_concatenation_of_feature_maps_along_the_channels() -> None:
    fusion = Concatenation.create(input_dims=[[2, 3, 5], [4, 3, 5]], dim=1)
    assert Concatenation.needed_globals(fusion.params) == {}
    assert fusion._context.store.get("output_size", "test", "") == 6
    assert fusion.output_specs()["outputs"].shape_text() == "[batch, 6, 3, 5]"
    maps = {"image_features": torch.randn(2, 2, 3, 5), "question_features": torch.randn(2, 4, 3, 5)}
    outputs = run(fusion, maps)
    assert torch.equal(outputs["outputs"][:, 2:], maps["question_features"])


@pytest.mark.parametrize(
    ("params", "key", "text"),
    [
        ({"input_dims": [[2, 3], [4, 5]], "dim": 1}, "input_dims", "only dimension 1"),
        ({"input_dims": [[2, 3], [4]]}, "input_dims", "different ranks"),
        ({"input_dims": [[2], [4], [1]]}, "input_dims", "3 shapes for 2 input streams"),
        ({"input_dims": [[2], [4]], "dim": 0}, "dim", "0 is the batch"),
        ({"input_dims": [[2], [4]], "dim": 2}, "dim", "not a feature dimension"),
    ],
)
def test_concatenation_rejects_shapes_it_cannot_join(
    params: dict[str, Any], key: str, text: str
) -> None:
    with pytest.raises(ComponentError, match=text) as error:
        Concatenation.create(name="joiner", **params)
    assert "'joiner' (Concatenation)" in str(error.value)


def test_concatenation_refuses_a_stream_listed_twice() -> None:
    with pytest.raises(pydantic.ValidationError, match="repeated: a"):
        Concatenation.create(input_streams=["a", "b", "a"])


def test_low_rank_bilinear_pooling_is_the_hadamard_product_of_tanh_projections() -> None:
    fusion = LowRankBilinearPooling.create(globals=SIZES, latent_size=8, output_size=3)
    batch = two_inputs()
    assert isinstance(fusion, LowRankBilinearPooling)
    x, y = batch["image_features"], batch["question_features"]
    u = torch.tanh(x @ fusion.image_projection.weight.T + fusion.image_projection.bias)
    v = torch.tanh(y @ fusion.question_projection.weight.T + fusion.question_projection.bias)
    projection = fusion.output_projection
    assert isinstance(projection, nn.Linear)
    expected = (u * v) @ projection.weight.T + projection.bias
    assert torch.allclose(fusion(batch)["outputs"], expected, atol=1e-6)


def test_factorized_bilinear_pooling_sums_every_factor_of_the_product() -> None:
    fusion = FactorizedBilinearPooling.create(
        globals=SIZES, factor=3, output_size=2, dropout=0.0, normalize=False
    )
    assert isinstance(fusion, FactorizedBilinearPooling)
    batch = two_inputs()
    product = fusion.image_projection(batch["image_features"]) * fusion.question_projection(
        batch["question_features"]
    )
    expected = torch.stack([product[:, 0:3].sum(1), product[:, 3:6].sum(1)], dim=1)
    assert torch.allclose(fusion(batch)["outputs"], expected, atol=1e-6)
    normalized = FactorizedBilinearPooling.create(globals=SIZES, factor=3, output_size=2)
    normalized.load_state_dict(fusion.state_dict())
    normalized.eval()
    outputs = normalized(batch)["outputs"]
    assert torch.allclose(outputs.norm(dim=1), torch.ones(5), atol=1e-5)
    root = expected.sign() * expected.abs().sqrt()
    assert torch.allclose(outputs, F.normalize(root, dim=1), atol=1e-3)


def test_signed_sqrt_is_continuous_and_has_finite_gradients_at_zero() -> None:
    values = torch.tensor([[0.0, 4.0, -9.0, 1e-12]], requires_grad=True)
    out = signed_sqrt_l2(values)
    assert out[0, 0] == 0 and out[0, 1] > 0 and out[0, 2] < 0
    assert torch.allclose(out, F.normalize(torch.tensor([[0.0, 2.0, -3.0, 0.0]]), dim=1), atol=1e-3)
    out.sum().backward()
    assert values.grad is not None and torch.isfinite(values.grad).all()


# ---- CompactBilinearPooling: the count sketch -------------------------------------------------
def test_compact_bilinear_hashes_come_from_the_seed_and_travel_in_the_state_dict() -> None:
    a = CompactBilinearPooling.create(globals=SIZES, output_size=64, seed=3)
    b = CompactBilinearPooling.create(globals=SIZES, output_size=64, seed=3)
    c = CompactBilinearPooling.create(globals=SIZES, output_size=64, seed=4)
    state = a.state_dict()
    assert set(state) == {"image_hashes", "image_signs", "question_hashes", "question_signs"}
    assert all(torch.equal(state[k], b.state_dict()[k]) for k in state)
    assert not torch.equal(state["image_hashes"], c.state_dict()["image_hashes"])
    assert set(state["image_signs"].tolist()) == {-1.0, 1.0}
    assert int(state["question_hashes"].max()) < 64 and state["question_hashes"].numel() == 4
    c.load_state_dict(state)  # a checkpoint brings the hashes it was trained with
    batch = two_inputs()
    assert torch.equal(a(batch)["outputs"], c(batch)["outputs"])
    assert sum(p.numel() for p in a.parameters()) == 0


def circular_convolution(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """out[k] = sum_j a[j] b[(k - j) mod d], by the definition (slow)."""
    d = a.shape[1]
    out = torch.zeros_like(a)
    for k in range(d):
        for j in range(d):
            out[:, k] += a[:, j] * b[:, (k - j) % d]
    return out


def test_compact_bilinear_pooling_is_the_count_sketch_of_the_outer_product() -> None:
    mcb = CompactBilinearPooling.create(globals=SIZES, output_size=16, normalize=False, seed=1)
    assert isinstance(mcb, CompactBilinearPooling)
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(3, 6, dtype=torch.float64, generator=generator)
    y = torch.randn(3, 4, dtype=torch.float64, generator=generator)
    outputs = mcb({"image_features": x, "question_features": y})["outputs"]
    assert outputs.dtype == torch.float64
    # Equal to the circular convolution of the two sketches, computed directly.
    sketch_x, sketch_y = mcb.sketches(x, y)
    assert torch.allclose(outputs, circular_convolution(sketch_x, sketch_y), atol=1e-12)
    # And to the count sketch of the outer product x y^T, with hash (h1(i) + h2(j)) mod d
    # and sign s1(i) s2(j): the identity MCB rests on.
    h1, s1 = mcb.image_hashes, mcb.image_signs.double()
    h2, s2 = mcb.question_hashes, mcb.question_signs.double()
    outer = (x[:, :, None] * y[:, None, :]).flatten(1)
    hashes = ((h1[:, None] + h2[None, :]) % 16).flatten()
    signs = (s1[:, None] * s2[None, :]).flatten()
    assert torch.allclose(outputs, count_sketch(outer, hashes, signs, 16), atol=1e-12)


def test_compact_bilinear_inner_products_estimate_those_of_the_outer_products() -> None:
    sizes = {"image_features_size": 20, "question_features_size": 12}
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 20, generator=generator), torch.randn(2, 12, generator=generator)
    # The second pair is correlated with the first, so the true inner product is large.
    x[1] = x[0] + 0.5 * x[1]
    y[1] = y[0] + 0.5 * y[1]
    true = float((x[0] @ x[1]) * (y[0] @ y[1]))
    estimates = []
    for seed in range(20):  # the estimator is unbiased over the random hashes
        mcb = CompactBilinearPooling.create(
            globals=sizes, output_size=4096, normalize=False, seed=seed
        )
        psi = mcb({"image_features": x, "question_features": y})["outputs"].double()
        estimates.append(float(psi[0] @ psi[1]))
    mean = sum(estimates) / len(estimates)
    assert abs(mean - true) < 0.05 * abs(true), (mean, true)
    # With d = 4096 every single estimate is already close (few hash collisions).
    assert max(abs(e - true) for e in estimates) < 0.2 * abs(true)


def test_compact_bilinear_pooling_normalizes_to_unit_length() -> None:
    mcb = CompactBilinearPooling.create(globals=SIZES, output_size=50)
    outputs = mcb(two_inputs())["outputs"]
    assert outputs.dtype == torch.float32
    assert torch.allclose(outputs.norm(dim=1), torch.ones(5), atol=1e-5)


# ---- QuestionDrivenAttention ------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["image", "fused"])
def test_question_driven_attention_over_feature_maps(mode: str) -> None:
    torch.manual_seed(0)
    attention = QuestionDrivenAttention.create(
        globals=SIZES, heads=3, latent_size=8, output_mode=mode, attention_maps=True
    )
    size = 3 * 6 + (4 if mode == "fused" else 0)
    assert attention._context.store.get("output_size", "test", "") == size
    assert attention.output_specs()["attention"].shape_text() == "[batch, 3, -1, -1]"
    maps = torch.randn(2, 6, 3, 5, requires_grad=True)
    question = torch.randn(2, 4, requires_grad=True)
    batch = {"image_features": maps, "question_features": question}
    outputs = run(attention, batch, **{"2": 3, "3": 5})
    weights = outputs["attention"]
    assert torch.allclose(weights.sum(dim=(2, 3)), torch.ones(2, 3), atol=1e-6)
    # Each head's output is its weighted sum of the (L2-normalised) location vectors.
    vectors = F.normalize(maps.detach(), dim=1)
    head_1 = (vectors * weights[:, 1:2].detach()).sum(dim=(2, 3))
    assert torch.allclose(outputs["outputs"][:, 6:12], head_1, atol=1e-6)
    if mode == "fused":
        assert torch.equal(outputs["outputs"][:, 18:], question)
    assert_gradients_flow(attention, batch)


def test_question_driven_attention_over_regions_of_any_count() -> None:
    attention = QuestionDrivenAttention.create(
        globals=SIZES, image_layout="regions", heads=2, attention_maps=True, normalize_image=False
    )
    assert attention.input_specs()["image_features"].shape_text() == "[batch, -1, 6]"
    for regions in (1, 7):
        batch = {
            "image_features": torch.randn(4, regions, 6),
            "question_features": torch.randn(4, 4),
        }
        outputs = attention(batch)
        assert outputs["outputs"].shape == (4, 12)
        assert outputs["attention"].shape == (4, 2, regions)
    single = attention(
        {"image_features": torch.ones(1, 1, 6), "question_features": torch.ones(1, 4)}
    )
    assert torch.allclose(single["outputs"], torch.ones(1, 12))  # one region: all weight on it
    assert "attention" not in QuestionDrivenAttention.create(globals=SIZES).output_specs()


# ---- learning an interaction ------------------------------------------------------------------
def product_sign_task(count: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Two random vectors; the class is whether x0 * y0 > 0: an XOR of two signs, which no
    linear function of the concatenated [x, y] separates."""
    x = torch.randn(count, 6, generator=generator)
    y = torch.randn(count, 4, generator=generator)
    targets = (x[:, 0] * y[:, 0] > 0).long()
    return {"image_features": x, "question_features": y, "targets": targets}


def selection_task(count: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Two image regions in random order, each a random vector tagged with its colour (one-hot,
    the last two features), and a question naming a colour; the class is the sign of the first
    feature of the region of that colour: a multiplexer, not linearly separable either."""
    regions = torch.randn(count, 2, 6, generator=generator)
    order = torch.randint(0, 2, (count,), generator=generator)  # colour of region 0
    regions[:, :, 4:] = F.one_hot(torch.stack([order, 1 - order], dim=1), 2).float()
    colour = torch.randint(0, 2, (count,), generator=generator)
    named = (colour != order).long()  # the region that has the colour asked for
    targets = (regions[torch.arange(count), named, 0] > 0).long()
    return {
        "image_features": regions,
        "question_features": F.one_hot(colour, 4).float(),
        "targets": targets,
    }


def train_and_score(fusion: Component, task: Any, fused_size: int, steps: int = 300) -> float:
    """Trains fusion + a linear classifier; returns the accuracy on fresh samples."""
    torch.manual_seed(0)
    classifier = nn.Linear(fused_size, 2)
    weights = [*fusion.parameters(), *classifier.parameters()]
    optimizer = torch.optim.Adam(weights, lr=0.02)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        batch = task(128, generator)
        loss = F.cross_entropy(classifier(fusion(batch)["outputs"]), batch["targets"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    fusion.eval()
    with torch.no_grad():
        test = task(2000, torch.Generator().manual_seed(99))
        hits = classifier(fusion(test)["outputs"]).argmax(1) == test["targets"]
    return float(hits.float().mean())


LEARNERS: list[tuple[type[Component], dict[str, Any], int]] = [
    (LowRankBilinearPooling, {"latent_size": 16}, 16),
    (CompactBilinearPooling, {"output_size": 64}, 64),
    (FactorizedBilinearPooling, {"factor": 2, "output_size": 8, "dropout": 0.0}, 8),
]


def test_concatenation_and_a_linear_layer_cannot_learn_the_interactions() -> None:
    concatenation = Concatenation.create(globals=SIZES)
    assert train_and_score(concatenation, product_sign_task, 10) < 0.6


@pytest.mark.parametrize(("cls", "params", "size"), LEARNERS)
def test_bilinear_fusions_learn_the_product_of_two_signs(
    cls: type[Component], params: dict[str, Any], size: int
) -> None:
    torch.manual_seed(0)
    fusion = cls.create(globals=SIZES, **params)
    assert train_and_score(fusion, product_sign_task, size) > 0.9


def test_question_driven_attention_learns_to_look_where_the_question_says() -> None:
    def flattened(count: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        batch = selection_task(count, generator)
        return {**batch, "image_features": batch["image_features"].flatten(1)}

    baseline = Concatenation.create(
        globals={"image_features_size": 12, "question_features_size": 4}
    )
    assert train_and_score(baseline, flattened, 16) < 0.8
    torch.manual_seed(0)
    attention = QuestionDrivenAttention.create(
        globals=SIZES, image_layout="regions", heads=1, latent_size=16
    )
    assert train_and_score(attention, selection_task, 6) > 0.9
