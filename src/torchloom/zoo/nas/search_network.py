"""The searchable DARTS network: every edge of a cell is a mixed operation, the
softmax(alpha)-weighted sum of all candidate operations.

The architecture parameters (`alpha_normal`, `alpha_reduce`: one row per edge, one column
per primitive) are shared by all cells of a kind. They are parameters of the component, so
checkpoints and `load:` carry them, but they do not require gradients: the weights'
optimizer never sees them. `training.architecture_search` (engine/architecture_search.py)
is what learns them, on its own half of the training data with its own optimizer; without
it they stay as they are.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

from torchloom.core.component import Batch, BuildContext
from torchloom.zoo.nas.common import CellPlan, DartsBase, DartsParams, plan_cells
from torchloom.zoo.nas.genotype import MAX_STEPS, Genotype, derive, edge_count
from torchloom.zoo.nas.operations import PRIMITIVES, operation, preprocessing


class MixedOperation(nn.Module):
    """All candidate operations of one edge; the output is their weighted sum."""

    def __init__(self, channels: int, stride: int) -> None:
        super().__init__()
        candidates = []
        for name in PRIMITIVES:
            op = operation(name, channels, stride, affine=False)
            if "pool" in name:  # as in DARTS: pooling gets a BatchNorm to scale like the rest
                op = nn.Sequential(op, nn.BatchNorm2d(channels, affine=False))
            candidates.append(op)
        self.candidates = nn.ModuleList(candidates)

    def forward(self, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return sum(w * op(x) for w, op in zip(weights, self.candidates, strict=True))


class SearchCell(nn.Module):
    """Two input nodes, `steps` intermediate nodes each fed by every earlier node through a
    mixed operation, output: the last `multiplier` nodes concatenated."""

    def __init__(self, plan: CellPlan, steps: int, multiplier: int) -> None:
        super().__init__()
        self.reduction, self.steps, self.multiplier = plan.reduction, steps, multiplier
        self.preprocess_0, self.preprocess_1 = preprocessing(
            plan.c_previous_previous, plan.c_previous, plan.channels, plan.reduction_previous, False
        )
        self.edges = nn.ModuleList(
            MixedOperation(plan.channels, 2 if plan.reduction and source < 2 else 1)
            for node in range(steps)
            for source in range(node + 2)
        )

    def forward(self, s0: torch.Tensor, s1: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        states = [self.preprocess_0(s0), self.preprocess_1(s1)]
        offset = 0
        for _ in range(self.steps):
            node = sum(self.edges[offset + j](h, weights[offset + j]) for j, h in enumerate(states))
            offset += len(states)
            states.append(node)
        return torch.cat(states[-self.multiplier :], dim=1)


class DartsNetworkParams(DartsParams):
    steps: int = Field(4, ge=1, le=MAX_STEPS, description="intermediate nodes per cell")
    multiplier: int = Field(
        4,
        ge=1,
        le=MAX_STEPS,
        description="last nodes concatenated into a cell's output (at most `steps`)",
    )


class DartsNetwork(DartsBase):
    """DARTS's searchable network (Liu et al. 2019): a stem, `cells` searchable cells
    (reduction cells at 1/3 and 2/3 of the depth), global pooling and a linear classifier.
    BatchNorm has no affine parameters. Train it with `training.architecture_search` to learn
    the architecture; the run writes `genotype.yml` and a `derived.yml` that trains the
    discrete network (DartsFixedNetwork) from scratch.

    ```yaml
    pipeline:
      image_classifier:
        type: DartsNetwork
        cells: 5
        channels: 8
        globals: {prediction_size: num_classes}
    ```
    """

    Params = DartsNetworkParams
    params: DartsNetworkParams

    def __init__(self, params: DartsNetworkParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.multiplier = multiplier = min(params.multiplier, params.steps)
        plans = plan_cells(params, multiplier)
        self.cells = nn.ModuleList(SearchCell(p, params.steps, multiplier) for p in plans)
        self.classifier_head(multiplier * plans[-1].channels)
        shape = (edge_count(params.steps), len(PRIMITIVES))
        # Zeros: every operation starts equally weighted (the and the paper's setting
        # up to the paper code's 1e-3 noise, which only breaks ties that the data breaks too).
        self.alpha_normal = nn.Parameter(torch.zeros(shape), requires_grad=False)
        self.alpha_reduce = nn.Parameter(torch.zeros(shape), requires_grad=False)

    def architecture_parameters(self) -> list[nn.Parameter]:
        return [self.alpha_normal, self.alpha_reduce]

    def weight_parameters(self) -> list[nn.Parameter]:
        alphas = {id(p) for p in self.architecture_parameters()}
        return [p for p in self.parameters() if id(p) not in alphas]

    def genotype(self) -> Genotype:
        return derive(self.alpha_normal, self.alpha_reduce, self.params.steps, self.multiplier)

    def edge_labels(self) -> list[str]:
        """'node <- source' per row of the alphas, for reports."""
        return [
            f"{node + 2}<-{source}"
            for node in range(self.params.steps)
            for source in range(node + 2)
        ]

    def operation_labels(self) -> list[str]:
        return list(PRIMITIVES)

    def alpha_softmax(self) -> dict[str, list[list[float]]]:
        return {
            kind: torch.softmax(alpha.detach().float(), dim=-1).tolist()
            for kind, alpha in (("normal", self.alpha_normal), ("reduce", self.alpha_reduce))
        }

    def derived_entry(self) -> dict[str, object]:
        """The pipeline entry of the discrete network this search has found so far: a
        DartsFixedNetwork of the same depth and width (change `cells`/`channels` in
        derived.yml to train a larger one, as the paper does)."""
        p = self.params
        return {
            "type": "DartsFixedNetwork",
            "cells": p.cells,
            "channels": p.channels,
            "reductions": p.reductions,
            "stem_multiplier": p.stem_multiplier,
            "log_softmax": p.log_softmax,
            "genotype": self.genotype().yaml_data(),
        }

    def forward(self, inputs: Batch) -> Batch:
        s0 = s1 = self.stem(inputs["inputs"])
        normal = torch.softmax(self.alpha_normal, dim=-1)
        reduce = torch.softmax(self.alpha_reduce, dim=-1)
        for cell in self.cells:
            s0, s1 = s1, cell(s0, s1, reduce if cell.reduction else normal)
        return {"predictions": self.classify(s1)}
