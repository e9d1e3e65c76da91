"""AccuracyStatistics: the accuracy of a whole set, not the mean of batch accuracies."""

from __future__ import annotations

import math
import weakref

import pytest
import torch

from torchloom.errors import ComponentError
from torchloom.zoo.statistics import AccuracyStatistics


def batch(targets: list[int], predicted: list[int], classes: int = 4) -> dict[str, torch.Tensor]:
    """Log-probabilities whose highest class is `predicted`, with their targets."""
    scores = torch.full((len(targets), classes), -5.0)
    scores[torch.arange(len(targets)), torch.tensor(predicted)] = 0.0
    return {"predictions": torch.log_softmax(scores, dim=1), "targets": torch.tensor(targets)}


# 2 of 2, 0 of 3, then 5 of 5 right: 7 of 10 over the set, but a mean of batch accuracies of 2/3.
BATCHES = [
    batch([0, 1], [0, 1]),
    batch([1, 2, 3], [0, 0, 0]),
    batch([3, 2, 1, 0, 3], [3, 2, 1, 0, 3]),
]


def batch_accuracy(values: dict[str, torch.Tensor]) -> float:
    return float((values["predictions"].argmax(dim=1) == values["targets"]).float().mean())


def test_accuracy_is_computed_over_the_whole_set() -> None:
    accuracy = AccuracyStatistics.create(globals={"num_classes": 4})
    for values in BATCHES:
        assert accuracy(values) == {}  # forward() only updates
    result = accuracy.compute()
    assert result == {"accuracy": pytest.approx(0.7)}
    mean_of_batches = sum(batch_accuracy(values) for values in BATCHES) / len(BATCHES)
    assert mean_of_batches == pytest.approx(2 / 3)
    assert result["accuracy"] != pytest.approx(mean_of_batches)


def test_reset_starts_a_new_set() -> None:
    accuracy = AccuracyStatistics.create(globals={"num_classes": 4})
    for values in BATCHES:
        accuracy.update(values)
    accuracy.reset()
    assert math.isnan(accuracy.compute()["accuracy"])  # an empty set has no accuracy
    accuracy.update(BATCHES[1])
    assert accuracy.compute() == {"accuracy": 0.0}


def test_ignored_targets_are_not_counted() -> None:
    accuracy = AccuracyStatistics.create(globals={"num_classes": 4})
    accuracy.update(batch([0, -100, -100, 2], [0, 1, 1, 1]))
    assert accuracy.compute() == {"accuracy": pytest.approx(0.5)}


def test_counters_stay_out_of_checkpoints_and_specs_name_the_streams() -> None:
    accuracy = AccuracyStatistics.create(globals={"num_classes": 4})
    accuracy.update(BATCHES[0])
    assert accuracy.state_dict() == {}
    assert set(accuracy.input_specs()) == {"predictions", "targets"}


def test_num_classes_is_needed() -> None:
    with pytest.raises(ComponentError) as error:
        AccuracyStatistics.create(name="accuracy")
    assert "num_classes" in str(error.value)
    assert "'accuracy' (AccuracyStatistics)" in str(error.value)


def test_ignore_index_inside_the_classes_is_left_out_of_both_counts() -> None:
    # <PAD> = 0 for word targets: a padded step predicted as 0 is neither right nor counted.
    accuracy = AccuracyStatistics.create(globals={"num_classes": 4}, ignore_index=0)
    accuracy.update(batch([0, 0, 2, 3], [0, 0, 2, 1]))
    assert accuracy.compute() == {"accuracy": pytest.approx(0.5)}
    counting_all = AccuracyStatistics.create(globals={"num_classes": 4}, ignore_index=None)
    counting_all.update(batch([0, 0, 2, 3], [0, 0, 2, 1]))
    assert counting_all.compute() == {"accuracy": pytest.approx(0.75)}


def test_the_running_copies_save_and_merge_their_counts() -> None:
    # A section's running copy puts its counts into checkpoints (exact mid-epoch resume) and
    # adds another process's counts; the pipeline's own statistic saves none (above).
    counting = AccuracyStatistics.create(globals={"num_classes": 4})
    counting.count_persistently()
    for values in BATCHES[:2]:
        counting.update(values)
    restored = AccuracyStatistics.create(globals={"num_classes": 4})
    restored.count_persistently()
    restored.load_state_dict(counting.state_dict())
    assert restored.compute() == {"accuracy": pytest.approx(2 / 5)}
    other = AccuracyStatistics.create(globals={"num_classes": 4})
    other.update(BATCHES[2])
    restored.merge(other)
    assert restored.compute() == {"accuracy": pytest.approx(0.7)}


def test_counts_saved_by_the_torchmetrics_version_still_resume() -> None:
    # Checkpoints written before the counts were kept here hold torchmetrics' micro
    # stat scores (tp, fp, tn, fn): a run resumed mid-epoch after an upgrade keeps them.
    from torchmetrics.classification import MulticlassAccuracy

    old = MulticlassAccuracy(num_classes=4, average="micro", validate_args=False)
    old.persistent(True)
    for values in BATCHES[:2]:
        old.update(values["predictions"], values["targets"])
    saved = {f"metric.{key}": value for key, value in old.state_dict().items()}
    restored = AccuracyStatistics.create(globals={"num_classes": 4})
    restored.count_persistently()
    restored.load_state_dict(saved)
    assert restored.compute() == {"accuracy": pytest.approx(2 / 5)}


def test_counting_accuracy_needs_no_torchmetrics() -> None:
    # torchmetrics takes seconds to import (it pulls in torchvision and torch._dynamo) and
    # every step paid its update wrapper: accuracy is two integers counted on the device.
    import subprocess
    import sys

    script = (
        "import sys\n"
        "import torch\n"
        "from torchloom.zoo.statistics import AccuracyStatistics\n"
        "a = AccuracyStatistics.create(globals={'num_classes': 3})\n"
        "a.ready(); a.count_persistently()\n"
        "a.update({'predictions': torch.eye(3), 'targets': torch.tensor([0, 1, 1])})\n"
        "assert abs(a.compute()['accuracy'] - 2 / 3) < 1e-9\n"
        "print('torchmetrics' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def random_steps(count: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Batches of varying sizes and sequence lengths, some targets the padding (0)."""
    generator = torch.Generator().manual_seed(seed)
    steps = []
    for _ in range(count):
        size, length = (int(v) for v in torch.randint(1, 9, (2,), generator=generator))
        steps.append(
            {
                "predictions": torch.randn(size, length, 5, generator=generator),
                "targets": torch.randint(0, 5, (size, length), generator=generator),
            }
        )
    return steps


def token_counts(steps: list[dict[str, torch.Tensor]]) -> tuple[int, int]:
    right = counted = 0
    for step in steps:
        kept = step["targets"] != 0
        right += int(((step["predictions"].argmax(-1) == step["targets"]) & kept).sum())
        counted += int(kept.sum())
    return right, counted


def test_counts_left_for_later_steps_are_in_every_read_of_them() -> None:
    """A step's counting waits (a few steps are counted together); a checkpoint, a merge or
    the value taken at any step still holds every step so far, exactly."""
    steps = random_steps(150)
    accuracy = AccuracyStatistics.create(sequence=True, ignore_index=0, globals={"num_classes": 5})
    accuracy.count_persistently()
    for done, step in enumerate(steps, start=1):
        accuracy.update(step)
        if done in (1, 63, 64, 65, 100):
            right, counted = token_counts(steps[:done])
            saved = accuracy.state_dict()
            assert (int(saved["right"]), int(saved["counted"])) == (right, counted)
            assert accuracy.compute() == {"accuracy": pytest.approx(right / counted)}
    other = AccuracyStatistics.create(sequence=True, ignore_index=0, globals={"num_classes": 5})
    other.count_persistently()
    for step in steps[:7]:  # counts still waiting in both when they merge
        other.update(step)
    other.merge(accuracy)
    right, counted = token_counts(steps + steps[:7])
    assert other.compute() == {"accuracy": pytest.approx(right / counted)}
    restored = AccuracyStatistics.create(sequence=True, ignore_index=0, globals={"num_classes": 5})
    restored.count_persistently()
    restored.update(steps[0])  # counted before the load: replaced by the loaded counts
    restored.load_state_dict(accuracy.state_dict())
    assert restored.compute() == accuracy.compute()


def test_a_training_step_keeps_none_of_its_tensors_and_asks_torch_for_four_operations() -> None:
    """The accuracy's update runs on every training step, where each tensor call costs more
    than its arithmetic (benchmarks/overhead.py): the argmax and the targets copied into
    buffers made once, the counting done later. It keeps none of the step's tensors: on the CPU
    small tensors kept for 64 steps beside each batch's images left the heap in pieces
    (benchmarks/host_step.py), and a CUDA graph would overwrite its outputs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        calls: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.calls.append(str(func))
            return func(*args, **(kwargs or {}))

    accuracy = AccuracyStatistics.create(globals={"num_classes": 4})
    accuracy.update(BATCHES[0])
    step = batch([3, 2, 1, 0, 3], [3, 2, 1, 0, 3])
    with Count() as count:
        accuracy.update(step)
    assert sorted(count.calls) == sorted(
        ["aten.slice.Tensor", "aten.slice.Tensor", "aten.copy_.default", "aten.argmax.out"]
    )
    kept = [weakref.ref(tensor) for tensor in step.values()]
    del step
    assert [reference() for reference in kept] == [None, None]
    assert accuracy.compute() == {"accuracy": pytest.approx(1.0)}


@pytest.mark.parametrize("sequence", [False, True])
def test_counts_stay_exact_when_the_pending_steps_fill_up_and_batches_grow(sequence: bool) -> None:
    """Steps are counted together once the buffers made at the first batch are full (64 steps
    of its size); a bigger batch than they hold gets bigger ones. Every count is exact."""
    generator = torch.Generator().manual_seed(0)
    accuracy = AccuracyStatistics.create(
        globals={"num_classes": 5}, sequence=sequence, ignore_index=0 if sequence else None
    )
    right = counted = 0
    for size in [2] * 70 + [300, 3, 1000, 2]:
        shape = (size, 3) if sequence else (size,)
        predictions = torch.randn(*shape, 5, generator=generator)
        targets = torch.randint(0, 5, shape, generator=generator)
        accuracy.update({"predictions": predictions, "targets": targets})
        kept = targets != 0 if sequence else torch.ones_like(targets, dtype=torch.bool)
        right += int(((predictions.argmax(-1) == targets) & kept).sum())
        counted += int(kept.sum())
    assert accuracy.compute() == {"accuracy": pytest.approx(right / counted)}
    assert int(accuracy.right) == right and int(accuracy.counted) == counted


def test_a_first_step_under_inference_mode_leaves_room_a_later_step_can_write() -> None:
    accuracy = AccuracyStatistics.create(globals={"num_classes": 4})
    with torch.inference_mode():
        accuracy.update(BATCHES[0])
    accuracy.update(BATCHES[2])
    assert accuracy.compute() == {"accuracy": pytest.approx(1.0)}
