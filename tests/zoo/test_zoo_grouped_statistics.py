"""AccuracyByGroupStatistics as the training loop counts with it: a few tensor calls a step,
the counting done later and exact at every read, and copies that add each other's counts
(the epoch's and the logging interval's copies, and several processes' shares)."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torchloom.zoo.grouped_statistics import AccuracyByGroupStatistics

NAMES = ["non_relational", "relational"]


def grouped(**params: object) -> AccuracyByGroupStatistics:
    statistic = AccuracyByGroupStatistics.create(group_names=NAMES, **params)
    statistic.count_persistently()
    return statistic  # type: ignore[return-value]


def random_steps(count: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Batches of 1 to 8 samples, some targets ignored (-100), some groups unnamed (-1, 2, 3)."""
    generator = torch.Generator().manual_seed(seed)
    steps = []
    for _ in range(count):
        size = int(torch.randint(1, 9, (), generator=generator))
        targets = torch.randint(0, 4, (size,), generator=generator)
        targets[torch.rand(size, generator=generator) < 0.2] = -100
        steps.append(
            {
                "predictions": torch.randn(size, 4, generator=generator),
                "targets": targets,
                "groups": torch.randint(-1, 4, (size,), generator=generator),
            }
        )
    return steps


def exact_counts(steps: list[dict[str, torch.Tensor]]) -> tuple[list[int], list[int]]:
    """(correct, total) per slot: the named groups, then the unnamed ones; ignored nowhere."""
    correct, total = [0, 0, 0], [0, 0, 0]
    for step in steps:
        hits = step["predictions"].argmax(1) == step["targets"]
        for hit, target, group in zip(hits, step["targets"], step["groups"], strict=True):
            if int(target) == -100:
                continue
            slot = int(group) if 0 <= int(group) < len(NAMES) else len(NAMES)
            total[slot] += 1
            correct[slot] += int(hit)
    return correct, total


def values_of(correct: list[int], total: list[int]) -> dict[str, float]:
    values = {"accuracy": sum(correct) / sum(total)}
    for index, name in enumerate(NAMES):
        values[f"accuracy_{name}"] = correct[index] / total[index]
    return values


def test_a_step_is_a_few_tensor_calls_and_keeps_none_of_its_tensors() -> None:
    """The update runs on every training step of a Sort-of-CLEVR run (two of them, by
    question type and subtype), where each tensor call costs more than its arithmetic (on a GPU
    a kernel launch): it copies the argmax, targets and groups into buffers made once, and the
    counting waits. No call reads a value back to the host."""

    class Count(TorchDispatchMode):
        calls: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.calls.append(str(func))
            return func(*args, **(kwargs or {}))

    statistic = grouped()
    first, step = random_steps(2)
    statistic.update(first)
    with Count() as count:
        statistic.update(step)
    assert sorted(count.calls) == sorted(
        ["aten.slice.Tensor"] * 3 + ["aten.copy_.default"] * 2 + ["aten.argmax.out"]
    )
    kept = [weakref.ref(tensor) for tensor in step.values()]
    del step
    assert [reference() for reference in kept] == [None, None, None]


def test_counts_left_for_later_steps_are_in_every_read_of_them() -> None:
    """Steps are counted together once the buffers are full (64 steps of the first batch's
    size); a bigger batch gets bigger buffers. A checkpoint, a merge or a value read at any
    step holds every step so far, exactly."""
    steps = random_steps(150)
    # 100 times the first batch's size: more than the buffers made for 64 steps of it hold.
    steps.append(
        {key: value.repeat(100, *[1] * (value.dim() - 1)) for key, value in steps[0].items()}
    )
    statistic = grouped()
    for done, step in enumerate(steps, start=1):
        statistic.update(step)
        if done in (1, 63, 64, 65, 100, len(steps)):
            correct, total = exact_counts(steps[:done])
            saved = statistic.state_dict()
            assert saved["correct"].tolist() == correct and saved["total"].tolist() == total
            assert statistic.compute() == pytest.approx(values_of(correct, total), nan_ok=True)
    restored = grouped()
    restored.update(steps[0])  # counted before the load: replaced by the loaded counts
    restored.load_state_dict(statistic.state_dict())
    assert restored.compute() == pytest.approx(statistic.compute())


def test_copies_add_each_others_counts() -> None:
    """What the training loop needs to update one copy a step instead of two (the epoch's and
    the logging interval's), and what several processes need to report one set's value."""
    steps = random_steps(40, seed=2)
    one, other = grouped(), grouped()
    assert one.can_merge
    for step in steps[:30]:
        one.update(step)
    for step in steps[30:]:  # still waiting to be counted in both when they merge
        other.update(step)
    one.merge(other)
    assert one.compute() == pytest.approx(values_of(*exact_counts(steps)))
    assert other.compute() == pytest.approx(values_of(*exact_counts(steps[30:])))
    one.reset()
    assert all(value != value for value in one.compute().values())  # NaN: an empty set


def test_counting_every_target_when_nothing_is_ignored() -> None:
    statistic = grouped(ignore_index=None)
    statistic.update(
        {
            "predictions": torch.tensor([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]]),
            "targets": torch.tensor([1, -100, 1]),  # -100 is a target like any other here
            "groups": torch.tensor([0, 0, 1]),
        }
    )
    assert statistic.compute() == {
        "accuracy": pytest.approx(2 / 3),
        "accuracy_non_relational": 0.5,
        "accuracy_relational": 1.0,
    }


def test_every_built_in_statistic_adds_another_copys_counts() -> None:
    """`merge` is what lets a statistic count a set that several processes share (`--nproc`,
    which refuses a statistic without it) and be updated once a training step instead of
    twice; the grouped accuracy and BLEU lacked it, so the Sort-of-CLEVR and VQA configs
    could not run under several processes."""
    from torchloom.core.component import Statistic
    from torchloom.core.registry import all_components

    statistics = {n: c for n, c in all_components().items() if issubclass(c, Statistic)}
    assert {"AccuracyByGroupStatistics", "BLEUStatistics", "AccuracyStatistics"} <= set(statistics)
    assert [name for name, cls in statistics.items() if cls.merge is Statistic.merge] == []
