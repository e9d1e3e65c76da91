"""Regularized (aging) evolution, as Real et al. 2019's Algorithm 1 says: the initial
population is random, each child's parent wins a tournament of S individuals drawn from the
population, and the oldest individual dies each cycle, however fit."""

from __future__ import annotations

import random

import pytest

from torchloom.errors import Where
from torchloom.nas.evolution import Individual, RegularizedEvolution, pareto_front
from torchloom.zoo.nas.genotype import genotype_problems, mutate_genotype, random_genotype


def _counter() -> RegularizedEvolution[int]:
    """Architectures are integers: random ones in [0, 100), a mutation adds 1."""
    return RegularizedEvolution(
        population_size=5,
        sample_size=3,
        random_architecture=lambda rng: rng.randrange(100),
        mutate=lambda architecture, rng: architecture + 1,
        seed=0,
    )


def test_the_oldest_dies_however_fit() -> None:
    evolution = _counter()
    for cycle in range(12):
        evolution.ask()
        # The first individual is by far the fittest; it must still die when it is oldest.
        evolution.tell(1000.0 if cycle == 0 else float(cycle))
        born = [individual.born for individual in evolution.population]
        assert born == list(range(max(0, cycle - 4), cycle + 1))  # the 5 most recent, in order
    assert evolution.best().born == 0  # the history keeps it
    assert all(individual.born != 0 for individual in evolution.population)


def test_random_until_the_population_is_full_then_children_of_tournament_winners() -> None:
    evolution = _counter()
    for _ in range(5):
        evolution.ask()
        evolution.tell(0.0)
    assert all(individual.parent is None for individual in evolution.history)
    for cycle in range(20):
        before = {i.born: i for i in evolution.population}
        architecture = evolution.ask()
        child = evolution.tell(float(cycle))
        assert child.parent in before  # a member of the population when the child was made
        assert architecture == before[child.parent].architecture + 1


def test_the_tournament_picks_the_fittest_of_a_sample_drawn_with_replacement() -> None:
    evolution = _counter()
    for fitness in (3.0, 1.0, 4.0, 1.5, 9.0):
        evolution.ask()
        evolution.tell(fitness)
    sizes, repeated = set(), False
    for _ in range(200):
        parent, sample = evolution.select_parent()
        sizes.add(len(sample))
        assert all(member in evolution.population for member in sample)
        assert parent.fitness == max(member.fitness for member in sample)
        repeated |= len({id(m) for m in sample}) < len(sample)
    assert sizes == {3} and repeated


def test_evolution_improves_on_random_search_in_the_darts_space() -> None:
    """Fitness: the number of separable convolutions in the normal cell (at most 8)."""

    def fitness(genotype):  # type: ignore[no-untyped-def]
        return float(sum(op.startswith("sep_conv") for op, _ in genotype.normal))

    evolution = RegularizedEvolution(20, 5, random_genotype, mutate_genotype, seed=1)
    best = evolution.run(fitness, 200)
    initial = max(i.fitness for i in evolution.history[:20])
    assert len(evolution.history) == 200 and len(evolution.population) == 20
    assert best.fitness > initial and best.fitness >= 7


def test_random_and_mutated_genotypes_are_valid_and_differ_in_one_edge() -> None:
    rng = random.Random(0)
    where: Where = lambda *keys: "x"  # noqa: E731
    for _ in range(50):
        genotype = random_genotype(rng)
        assert not genotype_problems(genotype, where, ("genotype",))
        child = mutate_genotype(genotype, rng)
        assert not genotype_problems(child, where, ("genotype",))
        changed = [
            (a, b)
            for kind in ("normal", "reduce")
            for a, b in zip(genotype.edges(kind), child.edges(kind), strict=True)
            if a != b
        ]
        assert len(changed) == 1
        for kind in ("normal", "reduce"):  # the two inputs of a node stay distinct
            edges = child.edges(kind)
            assert all(edges[i][1] != edges[i + 1][1] for i in range(0, len(edges), 2))


def test_pareto_front_of_accuracy_and_parameters() -> None:
    points = [
        Individual(name, accuracy, born, extra={"parameters": parameters})
        for born, (name, accuracy, parameters) in enumerate(
            [
                ("a", 0.90, 100),
                ("b", 0.92, 300),
                ("c", 0.89, 200),
                ("d", 0.92, 250),
                ("e", 0.80, 50),
            ]
        )
    ]
    front = pareto_front(points, lambda p: (p.fitness, -p.extra["parameters"]))
    assert sorted(p.architecture for p in front) == ["a", "d", "e"]


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="sample_size"):
        RegularizedEvolution(4, 5, lambda rng: 0, lambda a, rng: a)
    evolution = _counter()
    with pytest.raises(RuntimeError, match="ask"):
        evolution.tell(1.0)
    evolution.ask()
    with pytest.raises(RuntimeError, match="tell"):
        evolution.ask()
