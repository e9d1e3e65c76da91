"""Task.checked_index and Task.checked_positions: the positions a task's samples and a
gathered batch (`fetch`) are read at, with negative indices counted from the end, as for a
list, and any other index outside the task an IndexError naming it."""

from __future__ import annotations

import pytest
import torch

from torchloom.core.component import Task


def test_positions_count_negative_indices_from_the_end() -> None:
    positions = Task.checked_positions([0, 3, -1, -4, 2], 4)
    assert positions.dtype == torch.int64 and positions.tolist() == [0, 3, 3, 0, 2]
    assert Task.checked_positions(range(3), 3).tolist() == [0, 1, 2]
    assert Task.checked_positions([], 5).tolist() == []
    given = torch.tensor([2, 0])
    taken = Task.checked_positions(given, 4)  # type: ignore[arg-type]
    assert taken.tolist() == [2, 0] and taken is not given  # the batch's own tensor


@pytest.mark.parametrize("indices", [[0, 4, 1], [2, -5], [7, -9, 1]])
def test_an_index_outside_the_task_is_an_index_error_naming_the_first(
    indices: list[int],
) -> None:
    first_bad = next(i for i in indices if not -4 <= i < 4)
    with pytest.raises(IndexError, match=f"^index {first_bad} out of range for 4 samples$"):
        Task.checked_positions(indices, 4)
    with pytest.raises(IndexError, match=f"^index {first_bad} out of range for 4 samples$"):
        Task.checked_index(first_bad, 4)


def test_the_positions_of_a_batch_are_those_of_its_samples_one_by_one() -> None:
    generator = torch.Generator().manual_seed(0)
    indices = torch.randint(-50, 50, (256,), generator=generator).tolist()
    assert Task.checked_positions(indices, 50).tolist() == [
        Task.checked_index(i, 50) for i in indices
    ]
