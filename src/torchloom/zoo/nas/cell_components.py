"""One DARTS cell as a pipeline component, for stacks a config composes itself (a stem from
another component, a searchable cell, a head): `DartsCell` searches its own architecture
(its alphas are its own, not shared with other cells), `DartsFixedCell` is the discrete
cell of a genotype, what a search writes into derived.yml for a DartsCell.

Both read `inputs` (the previous cell's output) and `previous_inputs` (the one before it;
map both to the same stream for a first cell) and write `outputs`, `multiplier` nodes of
`channels` maps concatenated, at half the resolution when `reduction` is set.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from pydantic import Field

from torchloom.core.component import Batch, BuildContext, ComponentParams, Model
from torchloom.core.streams import FLOATING, StreamSpec
from torchloom.errors import ComponentError
from torchloom.zoo.nas.common import CellPlan
from torchloom.zoo.nas.fixed_network import FixedCell
from torchloom.zoo.nas.genotype import (
    MAX_CHANNELS,
    MAX_MAPS,
    MAX_STEPS,
    Genotype,
    derive,
    edge_count,
    genotype_problems,
)
from torchloom.zoo.nas.operations import PRIMITIVES, ScheduledDropPath
from torchloom.zoo.nas.search_network import SearchCell


class CellParams(ComponentParams):
    input_channels: int = Field(ge=1, le=MAX_MAPS, description="maps of `inputs`")
    previous_channels: int | None = Field(
        None, ge=1, le=MAX_MAPS, description="maps of `previous_inputs` (default: input_channels)"
    )
    reduction_previous: bool = Field(
        False, description="`previous_inputs` has twice the resolution of `inputs`"
    )
    channels: int = Field(16, ge=2, le=MAX_CHANNELS, description="maps per node")
    reduction: bool = Field(False, description="halve the resolution, as a reduction cell")
    drop_path: float = Field(0.0, ge=0.0, lt=1.0, description="fixed cell: drop-path probability")


def names_of(keys: tuple[Any, ...]) -> list[Any]:
    """A genotype's keys as this cell's parameters: `normal` is `edges`."""
    names = {"normal": "edges", "normal_concat": "concat"}
    return [names.get(k, k) if isinstance(k, str) else k for k in keys]


def _plan(params: CellParams) -> CellPlan:
    previous = params.previous_channels or params.input_channels
    return CellPlan(
        previous,
        params.input_channels,
        params.channels,
        params.reduction,
        params.reduction_previous,
    )


class _CellBase(Model):
    params: CellParams
    multiplier = 4

    def input_specs(self) -> dict[str, StreamSpec]:
        p = self.params
        return {
            "inputs": StreamSpec(("batch", p.input_channels, -1, -1), FLOATING, "a cell's output"),
            "previous_inputs": StreamSpec(
                ("batch", p.previous_channels or p.input_channels, -1, -1),
                FLOATING,
                "the output of the cell before it",
            ),
        }

    def output_specs(self) -> dict[str, StreamSpec]:
        maps = self.multiplier * self.params.channels
        return {"outputs": StreamSpec(("batch", maps, -1, -1), FLOATING, "the cell's output")}


class DartsCellParams(CellParams):
    steps: int = Field(4, ge=1, le=MAX_STEPS, description="intermediate nodes")
    multiplier: int = Field(
        4, ge=1, le=MAX_STEPS, description="last nodes concatenated (at most `steps`)"
    )
    drop_path: float = Field(0.0, ge=0.0, le=0.0, description="not used while searching")


class DartsCell(_CellBase):
    """One searchable DARTS cell (its own architecture parameters), learnt by
    `training.architecture_search` like a DartsNetwork.

    ```yaml
    pipeline:
      cell:
        type: DartsCell
        input_channels: 16
        channels: 8
        streams: {inputs: features, previous_inputs: features, outputs: cell_features}
    ```
    """

    Params = DartsCellParams
    params: DartsCellParams

    def __init__(self, params: DartsCellParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.multiplier = min(params.multiplier, params.steps)
        self.cell = SearchCell(_plan(params), params.steps, self.multiplier)
        shape = (edge_count(params.steps), len(PRIMITIVES))
        self.alpha = torch.nn.Parameter(torch.zeros(shape), requires_grad=False)

    def architecture_parameters(self) -> list[torch.nn.Parameter]:
        return [self.alpha]

    def genotype(self) -> Genotype:
        return derive(self.alpha, self.alpha, self.params.steps, self.multiplier)

    def edge_labels(self) -> list[str]:
        steps = self.params.steps
        return [f"{node + 2}<-{source}" for node in range(steps) for source in range(node + 2)]

    def operation_labels(self) -> list[str]:
        return list(PRIMITIVES)

    def alpha_softmax(self) -> dict[str, list[list[float]]]:
        kind = "reduce" if self.params.reduction else "normal"
        return {kind: torch.softmax(self.alpha.detach().float(), dim=-1).tolist()}

    def derived_entry(self) -> dict[str, Any]:
        keep = (
            "input_channels",
            "previous_channels",
            "reduction_previous",
            "channels",
            "reduction",
        )
        genotype = self.genotype().yaml_data()
        kind = "reduce" if self.params.reduction else "normal"
        cell = {"edges": genotype[kind], "concat": genotype[f"{kind}_concat"]}
        return {"type": "DartsFixedCell", **self.params.model_dump(include=set(keep)), **cell}

    def forward(self, inputs: Batch) -> Batch:
        weights = torch.softmax(self.alpha, dim=-1)
        return {"outputs": self.cell(inputs["previous_inputs"], inputs["inputs"], weights)}


class DartsFixedCellParams(CellParams):
    edges: list[tuple[str, int]] = Field(
        description="[operation, input node] per edge, two per intermediate node"
    )
    concat: list[int] = Field(description="nodes the output concatenates")
    drop_path_epochs: int | None = Field(
        None,
        ge=1,
        description="raise drop_path linearly from 0 over this many epochs (as "
        "DartsFixedNetwork's); unset: constant",
    )


class DartsFixedCell(_CellBase):
    """One discrete DARTS cell, as a genotype's `normal` (or `reduce`) list gives it.

    ```yaml
    pipeline:
      cell:
        type: DartsFixedCell
        input_channels: 16
        channels: 8
        edges: [[sep_conv_3x3, 0], [skip_connect, 1], [sep_conv_3x3, 1], [dil_conv_3x3, 2]]
        concat: [2, 3]
        streams: {inputs: features, previous_inputs: features, outputs: cell_features}
    ```
    """

    Params = DartsFixedCellParams
    params: DartsFixedCellParams

    def __init__(self, params: DartsFixedCellParams, context: BuildContext) -> None:
        # Checked as a genotype whose two cell kinds are this cell.
        genotype = Genotype(
            normal=params.edges,
            normal_concat=params.concat,
            reduce=params.edges,
            reduce_concat=params.concat,
        )
        found = genotype_problems(genotype, lambda *keys: context.where(*names_of(keys)), ())
        problems = [
            replace(p, subject=p.subject.replace("genotype.normal_concat", "concat"))
            for p in found
            if "reduce" not in p.subject
        ]
        problems = [
            replace(p, subject=p.subject.replace("genotype.normal", "edges")) for p in problems
        ]
        if problems:
            raise ComponentError(problems)
        super().__init__(params, context)
        self.multiplier = len(params.concat)
        self.cell = FixedCell(_plan(params), genotype)
        self.scheduled_drop_path = ScheduledDropPath(params.drop_path, params.drop_path_epochs)

    def start_epoch(self, epoch: int) -> None:
        self.scheduled_drop_path.start_epoch(epoch)

    def forward(self, inputs: Batch) -> Batch:
        cell = self.cell(inputs["previous_inputs"], inputs["inputs"], self.scheduled_drop_path)
        return {"outputs": cell}
