"""Schedulers from config: SequentialLR / ChainedScheduler get their inner schedulers built
from config entries (a warm-up is written in YAML), and keep exact state for resume."""

from __future__ import annotations

import pytest
import torch

from torchloom.engine.optim import build_scheduler
from torchloom.errors import ConfigError

WARM_UP = {
    "type": "SequentialLR",
    "milestones": [3],
    "schedulers": [
        {"type": "LinearLR", "start_factor": 0.1, "total_iters": 3},
        {"type": "CosineAnnealingLR", "T_max": 5},
    ],
}


def optimizer() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.5)


def rates(scheduler: torch.optim.lr_scheduler.LRScheduler, steps: int) -> list[float]:
    values = []
    for _ in range(steps):
        scheduler.optimizer.step()
        scheduler.step()
        values.append(scheduler.get_last_lr()[0])
    return values


def where(*keys: str | int) -> str:
    return "run.yml: " + ".".join(map(str, keys))


def test_a_warm_up_from_config_follows_torch_own_sequential_lr() -> None:
    built = build_scheduler(WARM_UP, optimizer(), where)
    assert isinstance(built, torch.optim.lr_scheduler.SequentialLR)
    plain = optimizer()
    reference = torch.optim.lr_scheduler.SequentialLR(
        plain,
        [
            torch.optim.lr_scheduler.LinearLR(plain, start_factor=0.1, total_iters=3),
            torch.optim.lr_scheduler.CosineAnnealingLR(plain, T_max=5),
        ],
        milestones=[3],
    )
    ours = rates(built, 8)
    assert ours == rates(reference, 8)
    assert ours[0] < ours[1] < ours[2] == pytest.approx(0.5)  # warms up to the base rate


def test_the_warm_up_resumes_from_its_state() -> None:
    first = build_scheduler(WARM_UP, optimizer(), where)
    rates(first, 2)
    resumed = build_scheduler(WARM_UP, optimizer(), where)
    resumed.optimizer.load_state_dict(first.optimizer.state_dict())
    resumed.load_state_dict(first.state_dict())
    assert rates(resumed, 5) == rates(first, 5)


def test_a_wrong_inner_scheduler_is_a_config_error() -> None:
    bad = {**WARM_UP, "schedulers": [{"type": "LinearLR"}, {"type": "CosineAnealingLR"}]}
    with pytest.raises(ConfigError) as error:
        build_scheduler(bad, optimizer(), where)
    message = str(error.value)
    # names the entry, where it was written, and the class it probably meant
    assert "training.scheduler.schedulers[1].type 'CosineAnealingLR'" in message
    assert "run.yml: training.scheduler.schedulers.1.type" in message
    assert "CosineAnnealingLR" in message.split("'CosineAnealingLR'", 1)[1]


@pytest.mark.parametrize("name", ["ReduceLROnPlateau", "LRScheduler"])
def test_a_scheduler_the_loop_cannot_step_is_a_config_error(name: str) -> None:
    """ReduceLROnPlateau passed `loom check` and failed at its first step (its step wants the
    monitored value: a TypeError, exit 1); the base class failed loom check with one."""
    with pytest.raises(ConfigError) as error:
        build_scheduler({"type": name}, optimizer(), where)
    assert "training.scheduler.type" in str(error.value) and "early stopping" in str(error.value)


def test_a_null_for_an_argument_that_needs_a_value_is_a_config_error() -> None:
    # `T_max: ${training.terminal_conditions.epoch_limit}` in online mode without an epoch
    # limit resolves to null: torch builds the scheduler and fails at its first step.
    with pytest.raises(ConfigError) as raised:
        build_scheduler({"type": "CosineAnnealingLR", "T_max": None}, optimizer(), where)
    message = raised.value.format()
    assert "run.yml: training.scheduler.T_max" in message
    assert "is null, but CosineAnnealingLR needs a value" in message
    # an argument whose default is null may be null
    built = build_scheduler(
        {"type": "StepLR", "step_size": 2, "last_epoch": -1}, optimizer(), where
    )
    assert built is not None
