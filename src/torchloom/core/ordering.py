"""Execution order: a component runs after every component whose output streams it reads.

The order is topological over stream dependencies between components (tasks are the sources
and always come first). When several components are ready at once, a lower `priority` runs
first (PyTorchPipe compatibility), then components without a priority, then declaration
order. A priority never overrides a data dependency.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection, Sequence
from typing import Any

from torchloom.core.component import Component
from torchloom.core.component_entry import ComponentEntry, Where
from torchloom.errors import Problem


def topological_order(
    depends: Sequence[Collection[int]], rank: Callable[[int], Any] = lambda i: i
) -> tuple[list[int], list[int]]:
    """Indices ordered so each comes after those it depends on (`depends[i]`); among the ready
    ones the lowest `rank` first. Returns (order, stuck): `stuck` lie on or behind a cycle."""
    remaining = {i: set(d) for i, d in enumerate(depends)}
    ready = [(rank(i), i) for i, d in remaining.items() if not d]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for j, d in remaining.items():
            if i in d:
                d.discard(i)
                if not d:
                    heapq.heappush(ready, (rank(j), j))
    placed = set(order)
    return order, [i for i in range(len(depends)) if i not in placed]


def _produced_by(built: list[tuple[ComponentEntry, Component]]) -> dict[str, list[int]]:
    producers: dict[str, list[int]] = {}
    for i, (_, component) in enumerate(built):
        for key in component.output_specs():
            producers.setdefault(component.stream_name(key), []).append(i)
    return producers


def execution_order(
    built: list[tuple[ComponentEntry, Component]],
    where: Where,
) -> tuple[list[ComponentEntry], list[Problem]]:
    """Entries in the order they must run, and a problem per dependency cycle."""
    producers = _produced_by(built)
    depends: list[dict[int, str]] = []  # index -> {producer index: the stream that links them}
    for i, (_, component) in enumerate(built):
        links: dict[int, str] = {}
        for key in component.input_specs():
            stream = component.stream_name(key)
            for j in producers.get(stream, []):
                if j != i:
                    links.setdefault(j, stream)
        depends.append(links)

    def rank(i: int) -> tuple[float, int]:
        entry = built[i][0]
        return (entry.priority if entry.priority is not None else math.inf, entry.index)

    order, stuck = topological_order(depends, rank)
    if not stuck:
        return [built[i][0] for i in order], []
    cycle = " -> ".join(
        f"{built[i][0].name} (reads '{depends[i][j]}' from {built[j][0].name})"
        for i in stuck
        for j in depends[i]
        if j in stuck
    )
    return [built[i][0] for i in order], [
        Problem(
            where("pipeline"),
            "stream cycle",
            f"these components wait on each other's outputs: {cycle}",
            "break the cycle by renaming one stream with a `streams:` mapping",
        )
    ]
