"""Regularized (aging) evolution as an Optuna sampler: `loom search --sampler evolution`.

Real, Aggarwal, Huang & Le, "Regularized Evolution for Image Classifier Architecture
Search", AAAI 2019, Algorithm 1, with the study as the population's memory:

    population = the `population_size` most recently completed trials (oldest first)
    while fewer trials have completed: a trial samples every parameter at random
    then each trial: draws `sample_size` members of the population uniformly at random (with
        replacement), takes the best of them on the study's objective as its parent, copies
        the parent's parameters and changes exactly one of them, chosen at random

A child joins the population when it completes, and the oldest member leaves, however good:
an individual survives only through its descendants ("aging"). The search's result is the
best trial of the whole history (best.yml). Failed and pruned trials have no fitness and never
join. The sampler keeps no state of its own: every worker, and a resumed search, reads the
population from the study, so `--workers K` is the paper's asynchronous variant (a worker
breeds from the trials completed so far). Each trial records its origin in its system
attributes (`evolution`: parent, the sample, the changed parameter), for reading the lineage.

The paper's mutations change one operation or one input of one cell edge; with a genotype's
edges as `choice` parameters of the space (docs/architecture-search.md), changing one
parameter is exactly that. A changed `choice`, `int` (a log one too) or stepped float takes
another of its values, uniformly; a continuous range is drawn again from its distribution
until it differs. A parameter the
parent did not have (one whose `when` condition the mutation switched on) is drawn at random.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.samplers import BaseSampler, RandomSampler
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

if TYPE_CHECKING:
    from optuna.study import Study

ORIGIN = "evolution"  # the system attribute with a trial's origin
MAX_INT_VALUES = 10_000  # a range listed whole to pick "another value"; beyond, redrawn


class RegularizedEvolutionSampler(BaseSampler):
    """Aging evolution (Real et al. 2019) over a search space: see the module's docstring."""

    def __init__(
        self, population_size: int = 20, sample_size: int = 5, seed: int | None = None
    ) -> None:
        if isinstance(population_size, bool) or not isinstance(population_size, int):
            raise ValueError(f"population_size must be an integer, got {population_size!r}")
        if isinstance(sample_size, bool) or not isinstance(sample_size, int):
            raise ValueError(f"sample_size must be an integer, got {sample_size!r}")
        if population_size < 2 or not 1 <= sample_size <= population_size:
            raise ValueError(
                f"population_size {population_size} and sample_size {sample_size}: need "
                "population_size >= 2 and 1 <= sample_size <= population_size"
            )
        self.population_size, self.sample_size, self.seed = population_size, sample_size, seed
        self._random = RandomSampler(seed=seed)

    # ---- Optuna's sampler interface --------------------------------------------------------
    def reseed_rng(self) -> None:
        self._random.reseed_rng()

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}  # every parameter is decided one at a time (sample_independent)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        """Choose the trial's parent by tournament, or none while the population fills."""
        self._raise_error_if_multi_objective(study)
        population = self.population(study)
        if len(population) < self.population_size:
            origin: dict[str, Any] = {"parent": None}
        else:
            rng = self._rng(trial.number, "tournament")
            sample = [rng.choice(population) for _ in range(self.sample_size)]
            parent = best_of(sample, study.direction)
            names = sorted(parent.params)
            origin = {
                "parent": parent.number,
                "sample": [member.number for member in sample],
                "mutated": rng.choice(names) if names else None,
                "params": dict(parent.params),
            }
        study._storage.set_trial_system_attr(trial._trial_id, ORIGIN, origin)

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        origin = trial.system_attrs.get(ORIGIN) or {}
        inherited = origin.get("params") or {}
        if origin.get("parent") is None or param_name not in inherited:
            return self._random.sample_independent(study, trial, param_name, param_distribution)
        value = inherited[param_name]
        if not _contains(param_distribution, value):  # the space changed on resume
            return self._random.sample_independent(study, trial, param_name, param_distribution)
        if param_name != origin.get("mutated"):
            return value
        return self._mutate(study, trial, param_name, param_distribution, value)

    # ---- the algorithm -----------------------------------------------------------------------
    def population(self, study: Study) -> list[FrozenTrial]:
        """The most recently completed `population_size` trials, oldest first."""
        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        complete = sorted(complete, key=lambda t: (t.datetime_complete, t.number))
        return complete[-self.population_size :]

    def _mutate(
        self,
        study: Study,
        trial: FrozenTrial,
        name: str,
        distribution: BaseDistribution,
        value: Any,
    ) -> Any:
        rng = self._rng(trial.number, name)
        if isinstance(distribution, CategoricalDistribution):
            others = [c for c in distribution.choices if c != value]
            return rng.choice(others) if others else value
        numbers = IntDistribution | FloatDistribution
        if isinstance(distribution, numbers) and distribution.step is not None:
            # An int range (a log one's step is 1) or a stepped float: listed whole when short.
            low, high, step = distribution.low, distribution.high, distribution.step
            count = round((high - low) / step) + 1
            if count <= MAX_INT_VALUES:
                values = [min(low + k * step, high) for k in range(count)]
                # A stepped float's grid point, as Optuna rounds it, within half a step.
                others = [v for v in values if abs(v - value) > step / 2]
                return rng.choice(others) if others else value
        # A wide or continuous range: drawn again until it changes (a float almost always).
        for _ in range(100):
            drawn = self._random.sample_independent(study, trial, name, distribution)
            if drawn != value:
                break
        return drawn

    def _rng(self, number: int, purpose: str) -> random.Random:
        """A generator of its own per trial and purpose: a seeded search breeds the same
        children whatever order workers ask in; an unseeded one differs each time."""
        if self.seed is None:
            return random.Random()
        return random.Random(f"{self.seed}:{number}:{purpose}")


def best_of(sample: Sequence[FrozenTrial], direction: StudyDirection) -> FrozenTrial:
    """The tournament's winner: the best value, the first drawn of equal ones."""
    sign = 1.0 if direction == StudyDirection.MAXIMIZE else -1.0
    best = sample[0]
    for member in sample[1:]:
        if sign * _value(member) > sign * _value(best):
            best = member
    return best


def _value(trial: FrozenTrial) -> float:
    assert trial.value is not None  # the population holds completed trials only
    return float(trial.value)


def _contains(distribution: BaseDistribution, value: Any) -> bool:
    try:
        return bool(distribution._contains(distribution.to_internal_repr(value)))
    except (ValueError, TypeError):
        return False


__all__ = ["ORIGIN", "RegularizedEvolutionSampler", "best_of"]
