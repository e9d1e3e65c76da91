"""The cells an evolution starts from, and the Pareto front search.html draws (the evolution
itself, aging and tournaments, is tested through its sampler: tests/search)."""

from __future__ import annotations

import random

from torchloom.errors import Where
from torchloom.search.pareto import pareto_front
from torchloom.zoo.nas.genotype import genotype_problems, random_genotype


def test_random_genotypes_are_valid_with_two_distinct_inputs_per_node() -> None:
    rng = random.Random(0)
    where: Where = lambda *keys: "x"  # noqa: E731
    seen = set()
    for _ in range(50):
        genotype = random_genotype(rng)
        assert not genotype_problems(genotype, where, ("genotype",))
        for kind in ("normal", "reduce"):
            edges = genotype.edges(kind)
            assert all(edges[i][1] != edges[i + 1][1] for i in range(0, len(edges), 2))
        seen.add(str(genotype.yaml_data()))
    assert len(seen) == 50


def test_pareto_front_of_accuracy_and_parameters() -> None:
    points = [
        ("a", 0.90, 100),
        ("b", 0.92, 300),
        ("c", 0.89, 200),
        ("d", 0.92, 250),
        ("e", 0.80, 50),
    ]
    front = pareto_front(points, lambda p: (p[1], -p[2]))
    assert sorted(name for name, _, _ in front) == ["a", "d", "e"]
