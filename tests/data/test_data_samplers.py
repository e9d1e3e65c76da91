"""Samplers: order is a pure function of (seed, epoch), resume mid-epoch is exact, splits
depend only on split_seed, and every user error names its culprit."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
import torch
from pydantic import TypeAdapter, ValidationError

from torchloom.config.sampler_schema import (
    KFoldSamplerConfig,
    SamplerConfig,
    SubsetSamplerConfig,
    WeightedSamplerConfig,
)
from torchloom.data.samplers import ResumableSampler, build_sampler
from torchloom.errors import DataError

N = 50
ADAPTER: TypeAdapter[SamplerConfig] = TypeAdapter(SamplerConfig)
WHERE = "configs/run.yml"


def make(
    entry: dict | None,
    *,
    seed: int = 7,
    shuffle: bool = True,
    size: int = N,
    targets: torch.Tensor | None = None,
) -> ResumableSampler:
    config = None if entry is None else ADAPTER.validate_python(entry)
    return build_sampler(config, size, seed=seed, shuffle=shuffle, targets=targets, where=WHERE)


def epoch_order(sampler: ResumableSampler, epoch: int) -> list[int]:
    sampler.set_epoch(epoch)
    return list(sampler)


# One shuffling entry per sampler type; the kfold one rotates every epoch.
SHUFFLING = {
    "default": None,
    "random": {"type": "random"},
    "subset": {"type": "subset", "fraction": 0.6},
    "subset_indices": {"type": "subset", "indices": list(range(0, N, 2))},
    "weighted": {"type": "weighted", "weights": [float(i % 5) for i in range(N)]},
    "kfold_train": {"type": "kfold", "folds": 4},
    "kfold_held_out": {"type": "kfold", "folds": 4, "held_out": True},
}
ALL = {
    **SHUFFLING,
    "sequential": {"type": "sequential"},
    "default_unshuffled": None,
    "subset_unshuffled": {"type": "subset", "fraction": 0.6, "shuffle": False},
    "kfold_unshuffled": {"type": "kfold", "folds": 3, "shuffle": False},
    "weighted_no_replacement": {
        "type": "weighted",
        "weights": [1.0] * N,
        "replacement": False,
        "num_samples": 20,
    },
}


@pytest.mark.parametrize("name", SHUFFLING)
def test_same_seed_and_epoch_give_same_order_and_epochs_differ(name: str) -> None:
    a, b = make(SHUFFLING[name]), make(SHUFFLING[name])
    torch.manual_seed(123)  # global RNG state must not matter ...
    first = epoch_order(a, 2)
    torch.rand(1000)  # ... nor its consumption by anything else
    assert epoch_order(b, 2) == first
    # kfold: epochs 2 and 6 share the held-out fold (4 folds), so only the shuffle differs.
    other_epoch = 6 if name.startswith("kfold") else 3
    assert epoch_order(a, other_epoch) != first
    assert epoch_order(make(SHUFFLING[name], seed=8), 2) != first


@pytest.mark.parametrize("name", ALL)
def test_resume_from_any_position_continues_the_same_order(name: str) -> None:
    shuffle = not name.endswith("unshuffled")
    sampler = make(ALL[name], shuffle=shuffle)
    for epoch in (0, 1, 5):
        full = epoch_order(sampler, epoch)
        assert sampler.epoch_length() == len(full) == len(sampler)
        for position in (0, 1, len(full) // 2, len(full) - 1, len(full)):
            resumed = make(ALL[name], shuffle=shuffle)  # a fresh process after the restart
            resumed.set_epoch(epoch)
            resumed.set_start(position)
            assert len(resumed) == len(full) - position
            assert list(resumed) == full[position:]
        sampler.set_start(3)
        sampler.set_epoch(epoch)  # resets the start
        assert list(sampler) == full


def test_set_start_rejects_positions_outside_the_epoch() -> None:
    sampler = make({"type": "random"})
    with pytest.raises(ValueError, match="51"):
        sampler.set_start(N + 1)
    with pytest.raises(ValueError, match="-1"):
        sampler.set_start(-1)


def test_default_and_sequential_orders() -> None:
    assert epoch_order(make(None, shuffle=False), 3) == list(range(N))
    assert epoch_order(make({"type": "sequential"}), 3) == list(range(N))
    assert sorted(epoch_order(make(None), 3)) == list(range(N))


@pytest.mark.parametrize("fraction", [0.9, 0.5, 0.33])
def test_subset_fraction_and_complement_partition_the_set_in_every_run(fraction: float) -> None:
    train_entry = {"type": "subset", "fraction": fraction, "split_seed": 3}
    valid_entry = {**train_entry, "complement": True}
    splits = []
    for run_seed in (0, 1, 99):
        train = set(epoch_order(make(train_entry, seed=run_seed), 0))
        valid = set(epoch_order(make(valid_entry, seed=run_seed, shuffle=False), 0))
        assert len(train) == round(fraction * N)
        assert train.isdisjoint(valid) and train | valid == set(range(N))
        splits.append(train)
    assert splits[0] == splits[1] == splits[2]
    other = set(epoch_order(make({**train_entry, "split_seed": 4}), 0))
    assert other != splits[0]


def test_subset_shuffle_follows_the_dataloader_unless_set() -> None:
    entry = {"type": "subset", "fraction": 0.5}
    unshuffled = epoch_order(make(entry, shuffle=False), 1)
    assert unshuffled == sorted(unshuffled)
    assert epoch_order(make(entry, shuffle=True), 1) != unshuffled
    assert epoch_order(make({**entry, "shuffle": False}, shuffle=True), 1) == unshuffled
    assert epoch_order(make({**entry, "shuffle": True}, shuffle=False), 1) != unshuffled


def test_subset_indices_and_their_complement() -> None:
    picked = [5, 3, 40, 0]
    entry = {"type": "subset", "indices": picked, "shuffle": False}
    assert epoch_order(make(entry), 0) == picked
    assert sorted(epoch_order(make({**entry, "shuffle": True}), 4)) == sorted(picked)
    rest = epoch_order(make({**entry, "complement": True}), 0)
    assert rest == [i for i in range(N) if i not in picked]


def test_kfold_training_and_held_out_agree_and_rotate() -> None:
    folds, per_fold = 4, 2
    entry = {"type": "kfold", "folds": folds, "epochs_per_fold": per_fold, "split_seed": 11}
    train = make(entry)
    held = make({**entry, "held_out": True})
    held_out_sets = []
    for epoch in range(folds * per_fold):
        t, h = set(epoch_order(train, epoch)), set(epoch_order(held, epoch))
        assert t.isdisjoint(h) and t | h == set(range(N))
        assert len(t) == train.epoch_length() and len(h) == held.epoch_length()
        if epoch % per_fold:
            assert h == held_out_sets[-1]  # same fold for epochs_per_fold epochs
        else:
            held_out_sets.append(h)
    assert len(held_out_sets) == folds
    counts = Counter(i for fold in held_out_sets for i in fold)
    assert sorted(counts) == list(range(N)) and set(counts.values()) == {1}
    # Uneven folds (50 = 13+13+12+12): the epoch length depends on the epoch.
    assert {len(f) for f in held_out_sets} == {12, 13}
    # The cut depends on split_seed only, never on the run seed; the wheel turns back.
    assert set(epoch_order(make({**entry, "held_out": True}, seed=1), 0)) == held_out_sets[0]
    assert set(epoch_order(held, folds * per_fold)) == held_out_sets[0]


def test_weighted_weights_never_draw_zero_weight_samples() -> None:
    weights = [0.0] * N
    weights[4], weights[9] = 1.0, 3.0
    drawn = epoch_order(make({"type": "weighted", "weights": weights, "num_samples": 400}), 0)
    assert len(drawn) == 400 and set(drawn) == {4, 9}
    assert 0.6 < drawn.count(9) / 400 < 0.9
    distinct = epoch_order(
        make({"type": "weighted", "weights": [1.0] * N, "replacement": False, "num_samples": 30}), 0
    )
    assert len(set(distinct)) == 30


def test_class_balanced_draws_every_class_about_equally() -> None:
    # 90% / 9% / 1%: uniform draws would give class 2 about 1% of the time.
    targets = torch.tensor([0] * 900 + [1] * 90 + [2] * 10)
    sampler = make({"type": "weighted", "class_balanced": True}, seed=0, size=1000, targets=targets)
    draws = Counter(int(targets[i]) for e in range(20) for i in epoch_order(sampler, e))
    total = sum(draws.values())
    assert total == 20_000
    for label in (0, 1, 2):
        # Binomial standard deviation of a share is ~0.0033 here: 0.03 is ~9 of them.
        assert abs(draws[label] / total - 1 / 3) < 0.03, draws


# ---- errors name their culprit ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "culprits"),
    [
        ({"type": "subset"}, ["indices", "fraction"]),
        ({"type": "subset", "indices": [1], "fraction": 0.5}, ["indices", "fraction"]),
        ({"type": "subset", "fraction": 0.0}, ["fraction"]),
        ({"type": "subset", "fraction": 1.5}, ["fraction"]),
        ({"type": "subset", "indices": [1, 2, 1]}, ["index 1", "twice"]),
        ({"type": "weighted"}, ["weights", "class_balanced"]),
        (
            {"type": "weighted", "weights": [1.0], "class_balanced": True},
            ["weights", "class_balanced"],
        ),
        ({"type": "weighted", "weights": [1.0, -2.0]}, ["weights[1]", "-2.0"]),
        ({"type": "weighted", "weights": [0.0, 0.0]}, ["weights", "zero"]),
        ({"type": "weighted", "class_balanced": True, "num_samples": 0}, ["num_samples"]),
        ({"type": "kfold", "folds": 1}, ["folds"]),
        ({"type": "kfold", "epochs_per_fold": 0}, ["epochs_per_fold"]),
        ({"type": "random", "sead": 3}, ["sead"]),
        ({"type": "shuffled"}, ["shuffled"]),
    ],
)
def test_schema_rejects_bad_entries_naming_the_culprit(entry: dict, culprits: list[str]) -> None:
    with pytest.raises(ValidationError) as caught:
        ADAPTER.validate_python(entry)
    for culprit in culprits:
        assert culprit in str(caught.value)


def test_schema_models_forbid_extra_keys_and_document_every_field() -> None:
    for model in (SubsetSamplerConfig, WeightedSamplerConfig, KFoldSamplerConfig):
        assert model.model_config.get("extra") == "forbid"
        assert all(f.description for f in model.model_fields.values()), model


@pytest.mark.parametrize(
    ("entry", "kwargs", "culprits"),
    [
        (
            {"type": "subset", "indices": [3, 50, 60]},
            {},
            ["sampler.indices", "index 50", "size 50"],
        ),
        ({"type": "subset", "indices": [-1]}, {}, ["index -1", "size 50"]),
        ({"type": "subset", "indices": []}, {}, ["subset is empty"]),
        ({"type": "subset", "fraction": 0.001}, {}, ["subset is empty", "fraction 0.001"]),
        ({"type": "subset", "fraction": 1.0, "complement": True}, {}, ["empty", "complement"]),
        ({"type": "subset", "indices": list(range(N)), "complement": True}, {}, ["empty"]),
        ({"type": "weighted", "weights": [1.0] * 7}, {}, ["sampler.weights", "7", "50"]),
        (
            {"type": "weighted", "class_balanced": True},
            {},
            ["class_balanced", "per-sample targets"],
        ),
        (
            {"type": "weighted", "class_balanced": True},
            {"targets": torch.zeros(N, 2).long()},
            ["1-D integer"],
        ),
        (
            {"type": "weighted", "class_balanced": True},
            {"targets": torch.zeros(N)},
            ["1-D integer"],
        ),
        (
            {"type": "weighted", "class_balanced": True},
            {"targets": torch.zeros(9).long()},
            ["9 targets", "size 50"],
        ),
        (
            {
                "type": "weighted",
                "weights": [0.0] * 45 + [1.0] * 5,
                "replacement": False,
                "num_samples": 6,
            },
            {},
            ["sampler.num_samples", "6 draws", "only 5"],
        ),
        ({"type": "kfold", "folds": 3}, {"size": 2}, ["sampler.folds", "3 folds", "size 2"]),
        (None, {"size": 0}, ["empty"]),
    ],
)
def test_data_errors_name_the_culprit(
    entry: dict | None, kwargs: dict, culprits: list[str]
) -> None:
    with pytest.raises(DataError) as caught:
        make(entry, **kwargs)
    message = str(caught.value)
    assert message.startswith(f"data error: {WHERE}: ")
    for culprit in culprits:
        assert culprit in message


def test_sampler_schema_imports_no_torch() -> None:
    code = "import torchloom.config.sampler_schema, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
