"""The second-order (unrolled) architecture gradient against the exact derivative of
F(alpha) = L_val(w - xi grad_w L_train(w, alpha), alpha), by central finite differences and by
double backpropagation, in float64.

Two problems: a tiny searchable DARTS network, and a smooth mixture of tanh layers. The
hypergradient's Hessian-vector product is itself a finite difference of step epsilon (0.01 in
the paper, relative to the gradient's norm); a ReLU/max-pool network's weight gradient jumps
where a unit switches, so at the paper's step the DARTS network's estimate is rough (the test
prints how rough) and the formula is checked there at a step too small to cross a switch,
while the smooth problem checks it at the paper's step."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
import torch
from torch.func import functional_call

from torchloom.engine.architecture_search import first_order_gradient, second_order_gradient
from torchloom.zoo.nas.search_network import DartsNetwork

GLOBALS = {"input_depth": 1, "input_height": 8, "input_width": 8, "prediction_size": 3}
XI = 0.05


@pytest.fixture
def problem() -> Iterator[tuple[DartsNetwork, dict[str, torch.Tensor], ...]]:
    torch.manual_seed(0)
    net = DartsNetwork.create(cells=3, channels=4, steps=2, multiplier=2, globals=GLOBALS)
    assert isinstance(net, DartsNetwork)
    net.double()
    with torch.no_grad():
        for alpha in net.architecture_parameters():
            alpha.normal_(0.0, 0.5)
    batches = [
        {
            "inputs": torch.randn(6, 1, 8, 8, dtype=torch.float64),
            "targets": torch.randint(0, 3, (6,)),
        }
        for _ in range(2)
    ]
    yield net, batches[0], batches[1]


def _loss(
    net: DartsNetwork, batch: dict[str, torch.Tensor], state: dict | None = None
) -> torch.Tensor:
    inputs = {"inputs": batch["inputs"]}
    out = net(inputs) if state is None else functional_call(net, state, (inputs,))
    return torch.nn.functional.cross_entropy(out["predictions"], batch["targets"])


def _unrolled_objective(
    net: DartsNetwork, train: dict, val: dict, alphas: list[torch.Tensor]
) -> torch.Tensor:
    """F(alpha), differentiable in alpha to second order."""
    names = dict(net.named_parameters())
    weight_names = [n for n in names if not n.startswith("alpha_")]
    weights = [names[n] for n in weight_names]
    state = {
        **{n: names[n] for n in weight_names},
        "alpha_normal": alphas[0],
        "alpha_reduce": alphas[1],
    }
    grads = torch.autograd.grad(_loss(net, train, state), weights, create_graph=True)
    stepped = {n: w - XI * g for n, w, g in zip(weight_names, weights, grads, strict=True)}
    return _loss(net, val, {**stepped, "alpha_normal": alphas[0], "alpha_reduce": alphas[1]})


@pytest.mark.parametrize("epsilon", [1e-7, 0.01], ids=["small-step", "paper-step"])
def test_second_order_gradient_on_a_darts_network(problem: tuple, epsilon: float) -> None:
    net, train, val = problem
    alphas = net.architecture_parameters()
    weights = net.weight_parameters()
    for alpha in alphas:
        alpha.requires_grad_(True)
    before = [w.detach().clone() for w in weights]
    ours = second_order_gradient(
        alphas,
        weights,
        [XI] * len(weights),
        lambda: _loss(net, train),
        lambda: _loss(net, val),
        epsilon,
    )
    assert all(torch.equal(w, b) for w, b in zip(weights, before, strict=True))  # restored

    exact, numeric, analytic = _references(net, train, val, alphas, ours)
    relative = _relative(ours, exact)
    directional = abs(analytic - numeric) / abs(numeric)
    print(
        f"DARTS network, epsilon {epsilon}: relative error {relative:.2e} against double "
        f"backprop, {directional:.2e} against finite differences of F"
    )
    if epsilon < 1e-3:
        assert relative < 1e-6 and directional < 1e-4
    else:  # rough, but it points the same way
        cosine = torch.nn.functional.cosine_similarity(_flat(ours), _flat(exact), dim=0)
        assert float(cosine) > 0.5, float(cosine)
    # The first-order gradient is a different quantity.
    first = first_order_gradient(alphas, lambda: _loss(net, val))
    assert _relative(first, exact) > 10 * min(relative, 1e-3)


def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.flatten() for t in tensors])


def _relative(ours: Sequence[torch.Tensor], exact: Sequence[torch.Tensor]) -> float:
    return float((_flat(ours) - _flat(exact)).norm() / _flat(exact).norm())


def _references(net, train, val, alphas, ours):  # type: ignore[no-untyped-def]
    """dF/dalpha by double backpropagation; F's central difference along a random direction
    and the same directional derivative from `ours`."""
    fresh = [a.detach().clone().requires_grad_(True) for a in alphas]
    exact = torch.autograd.grad(_unrolled_objective(net, train, val, fresh), fresh)
    direction = [torch.randn_like(a, generator=torch.Generator().manual_seed(1)) for a in alphas]
    # Tiny: F(alpha) jumps where a ReLU or a max switches in the virtual step's gradient.
    h = 1e-7
    with torch.enable_grad():
        ends = [
            _unrolled_objective(
                net,
                train,
                val,
                [a.detach() + sign * h * d for a, d in zip(alphas, direction, strict=True)],
            )
            for sign in (1.0, -1.0)
        ]
    numeric = float((ends[0] - ends[1]).detach() / (2 * h))
    analytic = float(sum((g * d).sum() for g, d in zip(ours, direction, strict=True)))
    return exact, numeric, analytic


@pytest.mark.parametrize(
    "rates", [[0.5] * 4, [0.5, 0.5, 0.1, 0.2]], ids=["one-rate", "param-groups"]
)
def test_second_order_gradient_on_a_smooth_problem_at_the_papers_step(
    rates: list[float],
) -> None:
    """A softmax(alpha)-weighted mixture of tanh layers: smooth, so the paper's epsilon gives
    the hypergradient to a small relative error; with a learning rate per weight tensor (the
    optimizer's param_groups) too."""
    torch.manual_seed(0)
    candidates = [torch.randn(5, 3, dtype=torch.float64, requires_grad=True) for _ in range(4)]
    alpha = torch.randn(4, dtype=torch.float64, requires_grad=True)
    x_train, x_val = (
        torch.randn(16, 5, dtype=torch.float64),
        torch.randn(16, 5, dtype=torch.float64),
    )
    y_train, y_val = torch.randint(0, 3, (16,)), torch.randint(0, 3, (16,))

    def loss(
        ws: Sequence[torch.Tensor], a: torch.Tensor, x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        weights = torch.softmax(a, dim=0)
        logits = sum(w * torch.tanh(x @ c) for w, c in zip(weights, ws, strict=True))
        return torch.nn.functional.cross_entropy(logits, y)  # type: ignore[arg-type]

    ours = second_order_gradient(
        [alpha],
        candidates,
        rates,
        lambda: loss(candidates, alpha, x_train, y_train),
        lambda: loss(candidates, alpha, x_val, y_val),
    )[0]

    def objective(a: torch.Tensor) -> torch.Tensor:
        grads = torch.autograd.grad(
            loss(candidates, a, x_train, y_train), candidates, create_graph=True
        )
        stepped = [c - xi * g for c, g, xi in zip(candidates, grads, rates, strict=True)]
        return loss(stepped, a, x_val, y_val)

    exact = torch.autograd.grad(objective(alpha), alpha)[0]
    h = 1e-5
    numeric = torch.stack(
        [
            (objective(alpha + h * e) - objective(alpha - h * e)).detach() / (2 * h)
            for e in torch.eye(4, dtype=torch.float64)
        ]
    )
    relative = float((ours - numeric).norm() / numeric.norm())
    print(f"smooth problem, epsilon 0.01: relative error {relative:.2e} against finite differences")
    assert float((exact - numeric).norm() / numeric.norm()) < 1e-8  # the references agree
    assert relative < 1e-3
