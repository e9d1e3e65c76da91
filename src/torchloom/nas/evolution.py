"""Regularized (aging) evolution: Real, Aggarwal, Huang & Le, "Regularized Evolution for Image
Classifier Architecture Search", AAAI 2019 (their Algorithm 1).

    population <- the P most recent individuals (a queue, oldest on the left)
    while fewer than P individuals: add a random architecture, evaluated
    each cycle: sample S individuals from the population uniformly at random (with
                replacement), mutate the fittest of the sample, evaluate the child, add it
                on the right, and remove the oldest individual on the left, however fit

Removing the oldest rather than the worst is the "regularization": an architecture survives
only by having fit descendants, so a lucky evaluation cannot dominate the search for ever.
The best of the whole history is the result.

The algorithm is generic in the architecture (anything `random_architecture` returns and
`mutate` accepts) and asks for evaluations one at a time (`ask`, `tell`), which is what a
sampler of a study needs; `run` is the plain loop. Ties in fitness go to the earlier sample.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

A = TypeVar("A")
P = TypeVar("P")


@dataclass
class Individual(Generic[A]):
    architecture: A
    fitness: float
    born: int  # its position in the history, from 0
    parent: int | None = None  # the parent's `born`, None for the random initial ones
    extra: dict[str, Any] = field(default_factory=dict)  # other measures (parameters, ...)


class RegularizedEvolution(Generic[A]):
    def __init__(
        self,
        population_size: int,
        sample_size: int,
        random_architecture: Callable[[random.Random], A],
        mutate: Callable[[A, random.Random], A],
        seed: int = 0,
    ) -> None:
        if population_size < 2 or not 1 <= sample_size <= population_size:
            raise ValueError(
                f"population_size {population_size} and sample_size {sample_size}: need "
                "2 <= population_size and 1 <= sample_size <= population_size"
            )
        self.population_size, self.sample_size = population_size, sample_size
        self.random_architecture, self.mutate = random_architecture, mutate
        self.rng = random.Random(seed)
        self.population: deque[Individual[A]] = deque()
        self.history: list[Individual[A]] = []
        self._pending: tuple[A, int | None] | None = None

    # ---- one step at a time ----------------------------------------------------------------
    def select_parent(self) -> tuple[Individual[A], list[Individual[A]]]:
        """The tournament: the fittest of `sample_size` individuals drawn with replacement."""
        members = list(self.population)
        sample = [self.rng.choice(members) for _ in range(self.sample_size)]
        best = sample[0]
        for candidate in sample[1:]:
            if candidate.fitness > best.fitness:
                best = candidate
        return best, sample

    def ask(self) -> A:
        """The next architecture to evaluate: random until the population is full, then a
        mutation of a tournament's winner."""
        if self._pending is not None:
            raise RuntimeError("tell() the fitness of the last architecture asked for first")
        if len(self.history) < self.population_size:
            self._pending = (self.random_architecture(self.rng), None)
        else:
            parent, _ = self.select_parent()
            self._pending = (self.mutate(parent.architecture, self.rng), parent.born)
        return self._pending[0]

    def tell(self, fitness: float, **extra: Any) -> Individual[A]:
        """Record the fitness of the architecture `ask` returned; the population ages."""
        if self._pending is None:
            raise RuntimeError("ask() for an architecture before telling its fitness")
        architecture, parent = self._pending
        self._pending = None
        child = Individual(architecture, float(fitness), len(self.history), parent, dict(extra))
        self.population.append(child)
        self.history.append(child)
        if len(self.population) > self.population_size:
            self.population.popleft()  # the oldest dies, however fit
        return child

    # ---- the whole loop --------------------------------------------------------------------
    def run(self, evaluate: Callable[[A], float], evaluations: int) -> Individual[A]:
        """Evaluate `evaluations` architectures in all (the initial population included);
        the fittest of the whole history."""
        while len(self.history) < evaluations:
            self.tell(evaluate(self.ask()))
        return self.best()

    def best(self) -> Individual[A]:
        return max(self.history, key=lambda individual: individual.fitness)


def pareto_front(points: Sequence[P], objectives: Callable[[P], Sequence[float]]) -> list[P]:
    """The individuals no other one dominates, every objective to be maximised (negate one
    to minimise it, e.g. the parameter count): at least as good in all, better in one."""

    def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
        return all(x >= y for x, y in zip(a, b, strict=True)) and any(
            x > y for x, y in zip(a, b, strict=True)
        )

    scored = [(p, tuple(objectives(p))) for p in points]
    return [p for p, s in scored if not any(dominates(t, s) for _, t in scored)]
