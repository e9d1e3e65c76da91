"""StepBuffer: training-step tensors handed over a block at a time, with the same result as
step by step, and bounded in steps and in elements."""

from __future__ import annotations

import torch

from torchloom.analysis.classification_numbers import ClassCounts
from torchloom.analysis.step_buffer import StepBuffer


def test_blocks_are_the_steps_concatenated_in_order() -> None:
    blocks: list[tuple[torch.Tensor, torch.Tensor]] = []
    buffer = StepBuffer(lambda a, b: blocks.append((a, b)), steps=3)
    steps = [(torch.full((2, 4), float(i)), torch.full((2,), i)) for i in range(7)]
    for a, b in steps:
        buffer.add(a, b)
    assert len(blocks) == 2 and len(buffer) == 1  # 3 + 3 handed over, 1 held
    buffer.flush()
    buffer.flush()  # nothing held: no empty block
    assert [len(b) for _, b in blocks] == [6, 6, 2]
    assert torch.equal(torch.cat([a for a, _ in blocks]), torch.cat([a for a, _ in steps]))
    assert torch.equal(torch.cat([b for _, b in blocks]), torch.cat([b for _, b in steps]))


def test_a_block_is_handed_over_once_it_holds_enough_elements() -> None:
    sizes: list[int] = []
    buffer = StepBuffer(lambda a: sizes.append(len(a)), steps=100, elements=1000)
    for _ in range(5):
        buffer.add(torch.zeros(8, 50))  # 400 values a step: the third step passes 1000
    assert sizes == [24]
    assert len(buffer) == 2


def test_held_tensors_are_detached_copies() -> None:
    held: list[torch.Tensor] = []
    buffer = StepBuffer(held.append, steps=10)
    weight = torch.ones(3, requires_grad=True)
    buffer.add(weight * 2)
    # The next step writes over the memory of this one's output (as a model compiled with
    # CUDA graphs does): the held step keeps its values.
    output = torch.full((3,), 5.0)
    buffer.add(output)
    output.fill_(-1.0)
    buffer.flush()
    assert not held[0].requires_grad
    assert held[0].tolist() == [2.0, 2.0, 2.0, 5.0, 5.0, 5.0]


def test_counts_from_blocks_equal_counts_step_by_step() -> None:
    generator = torch.Generator().manual_seed(0)
    steps = [
        (torch.randn(16, 5, generator=generator), torch.randint(-1, 5, (16,), generator=generator))
        for _ in range(9)
    ]
    direct, blocked = (
        ClassCounts(5, torch.device("cpu"), True),
        ClassCounts(5, torch.device("cpu"), True),
    )
    buffer = StepBuffer(blocked.add, steps=4)
    for scores, targets in steps:
        direct.add(scores, targets)
        buffer.add(scores, targets)
    buffer.flush()
    assert torch.equal(direct.confusion, blocked.confusion)
    assert torch.equal(direct.scores, blocked.scores)
