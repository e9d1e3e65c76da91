"""The plotting budget: drawings during a run stay under a share of its wall time, counting
what the next drawing is expected to cost, not only what was spent."""

from __future__ import annotations

import pytest

from torchloom.analysis import plotting
from torchloom.analysis.plotting import PlotBudget


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(plotting.time, "perf_counter", fake)
    return fake


def draw(budget: PlotBudget, clock: Clock, kind: str, seconds: float) -> None:
    with budget.timed(kind):
        clock.now += seconds


def test_first_drawing_waits_until_its_guessed_cost_fits(clock: Clock) -> None:
    budget = PlotBudget(fraction=0.01)
    clock.now += 90.0  # 0.9 s of budget, less than the first guess of 1 s
    assert not budget.due("plots")
    clock.now += 11.0  # 1.01 s
    assert budget.due("plots")


def test_expected_cost_of_each_kind_is_the_last_drawing_of_that_kind(clock: Clock) -> None:
    budget = PlotBudget(fraction=0.01)
    clock.now += 200.0  # 2 s of budget
    draw(budget, clock, "slow", 1.5)  # spent 1.5 of 2.015
    # a second slow drawing would end at 3 s spent of about 2.015 allowed: not yet
    assert not budget.due("slow")
    clock.now += 50.0  # 2.515 s allowed: 1.5 spent + a first guess of 1 s for a new kind
    assert budget.due("fast")
    draw(budget, clock, "fast", 0.05)
    assert budget.due("fast")  # 1.6 <= 2.5155
    assert not budget.due("slow")  # 3.05 > 2.5155
    clock.now += 50.0  # 3.0155 s allowed: 1.55 spent + 1.5 expected does not fit yet
    assert not budget.due("slow")
    clock.now += 5.0  # 3.0655
    assert budget.due("slow")


def test_spent_time_stays_under_the_share_over_a_run(clock: Clock) -> None:
    budget = PlotBudget(fraction=0.01)
    for _epoch in range(50):
        clock.now += 6.5  # an epoch of a short run
        if budget.due("plots"):
            draw(budget, clock, "plots", 0.5)
    elapsed = clock.now - budget.started
    assert 0 < budget.spent <= 0.01 * elapsed
