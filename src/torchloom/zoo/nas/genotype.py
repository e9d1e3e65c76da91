"""A DARTS genotype: the discrete cell a search ends with, as written in YAML.

    genotype:
      normal: [[sep_conv_3x3, 0], [sep_conv_3x3, 1], ...]  # two edges per intermediate node
      normal_concat: [2, 3, 4, 5]                            # nodes the cell's output joins
      reduce: [[max_pool_3x3, 0], [max_pool_3x3, 1], ...]
      reduce_concat: [2, 3, 4, 5]

Nodes 0 and 1 are the cell's inputs (the outputs of the two previous cells); intermediate
node i (from 2) sums the two edges at entries 2(i-2) and 2(i-2)+1, each an operation applied
to an earlier node. `derive()` turns architecture parameters into a genotype the way the
paper does: per node, the two strongest non-`none` operations from distinct predecessors.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from pydantic import ConfigDict, Field

from torchloom.config_model import ConfigModel
from torchloom.errors import Problem, Where, did_you_mean
from torchloom.zoo.nas.operations import PRIMITIVES

CELL_KINDS = ("normal", "reduce")
# Bounds on a config's sizes, far above what DARTS uses (4 intermediate nodes, 8 or 20 cells of
# 16 or 36 maps), so that a config from someone else cannot ask for modules without end: the
# modules grow as cells x steps^2 x operations, and a million cells took the machine's memory
# for a minute before a bare MemoryError.
MAX_STEPS = 12
MAX_CELLS = 100
MAX_CHANNELS = 1024
MAX_MAPS = 16 * MAX_CHANNELS  # a cell's input: up to stem_multiplier or steps x channels


class Genotype(ConfigModel):
    """A genotype as the `genotype:` parameter of DartsFixedNetwork."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    normal: list[tuple[str, int]] = Field(
        max_length=2 * MAX_STEPS,
        description="normal cell: [operation, input node] per edge, two per intermediate node",
    )
    normal_concat: list[int] = Field(
        max_length=MAX_STEPS, description="nodes the normal cell's output concatenates"
    )
    reduce: list[tuple[str, int]] = Field(
        max_length=2 * MAX_STEPS,
        description="reduction cell: [operation, input node] per edge, two per node",
    )
    reduce_concat: list[int] = Field(
        max_length=MAX_STEPS, description="nodes the reduction cell's output concatenates"
    )

    def edges(self, kind: str) -> list[tuple[str, int]]:
        return list(self.normal if kind == "normal" else self.reduce)

    def concat(self, kind: str) -> list[int]:
        return list(self.normal_concat if kind == "normal" else self.reduce_concat)

    def yaml_data(self) -> dict[str, Any]:
        return {
            "normal": [[op, node] for op, node in self.normal],
            "normal_concat": list(self.normal_concat),
            "reduce": [[op, node] for op, node in self.reduce],
            "reduce_concat": list(self.reduce_concat),
        }


def genotype_problems(
    genotype: Genotype, where: Where, key: tuple[str | int, ...]
) -> list[Problem]:
    """Every mistake of a genotype at once, each at its own line: an unknown or `none`
    operation, an edge from its own node or a later one, an odd edge count, a concatenated
    node that the cell does not have."""
    problems = []
    for kind in CELL_KINDS:
        edges = genotype.edges(kind)
        if not edges or len(edges) % 2:
            problems.append(
                Problem(
                    where(*key, kind),
                    f"genotype.{kind}",
                    f"has {len(edges)} edges; a cell needs two per intermediate node",
                    "list an even number of [operation, input node] pairs",
                )
            )
        for index, (name, node) in enumerate(edges):
            target = index // 2 + 2
            here, subject = where(*key, kind, index), f"genotype.{kind}[{index}]"
            if name not in PRIMITIVES or name == "none":
                hint = (
                    did_you_mean(name, PRIMITIVES[1:]) or f"operations: {', '.join(PRIMITIVES[1:])}"
                )
                problems.append(Problem(here, subject, f"'{name}' is not a DARTS operation", hint))
            if not 0 <= node < target:
                problems.append(
                    Problem(
                        here,
                        subject,
                        f"wires node {target} to node {node}, which is "
                        + ("not earlier in the cell" if node >= 0 else "not a node"),
                        f"node {target} may read nodes 0 to {target - 1}; 0 and 1 are the "
                        "cell's inputs",
                    )
                )
        nodes = len(edges) // 2 + 2
        concat = genotype.concat(kind)
        for index, node in enumerate(concat):
            if node in concat[:index]:  # each repeat would add the node's maps once more
                problems.append(
                    Problem(
                        where(*key, f"{kind}_concat", index),
                        f"genotype.{kind}_concat[{index}]",
                        f"is node {node} again: the output joins each node once",
                    )
                )
            elif not 2 <= node < nodes:
                problems.append(
                    Problem(
                        where(*key, f"{kind}_concat", index),
                        f"genotype.{kind}_concat[{index}]",
                        f"is node {node}, but the cell's intermediate nodes are 2 to {nodes - 1}",
                    )
                )
    return problems


def reduction_positions(cells: int, reductions: int) -> list[int]:
    """Indices of the reduction cells: evenly spaced, at 1/3 and 2/3 of the depth for two."""
    return [cells * k // (reductions + 1) for k in range(1, reductions + 1)]


def reduction_problem(cells: int, reductions: int, where: str, label: str) -> Problem | None:
    positions = reduction_positions(cells, reductions)
    if len(set(positions)) == len(positions) and (not positions or positions[0] > 0):
        return None
    return Problem(
        where,
        label,
        f"{reductions} reduction cells do not fit {cells} cells: they would sit at cells "
        f"{positions}, and each needs a normal cell before it",
        f"use at least {reductions + 1} cells, or fewer reductions",
    )


def derive(
    alpha_normal: torch.Tensor, alpha_reduce: torch.Tensor, steps: int, multiplier: int
) -> Genotype:
    """The genotype of architecture parameters (one row per edge, one column per primitive,
    edges ordered node by node): for each intermediate node, the two predecessors whose
    strongest non-`none` operation is strongest, each with that operation; the cell's output
    is its last `multiplier` nodes, as the searched cell's."""

    def cell(alpha: torch.Tensor) -> list[tuple[str, int]]:
        weights = torch.softmax(alpha.detach().float(), dim=-1)
        none = PRIMITIVES.index("none")
        weights[:, none] = -1.0  # never chosen
        edges, start = [], 0
        for node in range(steps):
            inputs = node + 2
            rows = weights[start : start + inputs]
            strongest = rows.max(dim=1)
            # Ties go to the earlier predecessor and the earlier primitive (stable sort).
            order = sorted(range(inputs), key=lambda j: -float(strongest.values[j]))[:2]
            for j in sorted(order):
                edges.append((PRIMITIVES[int(strongest.indices[j])], j))
            start += inputs
        return edges

    concat = list(range(2 + steps - multiplier, steps + 2))
    return Genotype(
        normal=cell(alpha_normal),
        normal_concat=concat,
        reduce=cell(alpha_reduce),
        reduce_concat=concat,
    )


def edge_count(steps: int) -> int:
    return sum(node + 2 for node in range(steps))


# ---- random cells (the first population of an evolution, benchmarks/nas.py) ---------------
OPERATIONS = PRIMITIVES[1:]  # a discrete cell has no `none` edges


def random_genotype(rng: random.Random, steps: int = 4) -> Genotype:
    """Each intermediate node: two operations on two distinct earlier nodes, uniformly."""

    def cell() -> list[tuple[str, int]]:
        edges = []
        for node in range(2, steps + 2):
            for source in sorted(rng.sample(range(node), 2)):
                edges.append((rng.choice(OPERATIONS), source))
        return edges

    concat = list(range(2, steps + 2))
    return Genotype(normal=cell(), normal_concat=concat, reduce=cell(), reduce_concat=concat)
