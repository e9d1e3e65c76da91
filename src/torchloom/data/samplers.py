"""Samplers whose order for an epoch is a pure function of (seed, epoch), for exact resume.

A run killed mid-epoch and resumed from a checkpoint must see exactly the order an
uninterrupted run would have seen. So every sampler draws from its own torch.Generator seeded
from (seed, epoch), never from the global RNG (which model init and dropout also consume), and
can start part-way through an epoch:

    sampler = build_sampler(config, len(dataset), seed=7, shuffle=True)
    sampler.set_epoch(3)        # the order of epoch 3 ...
    sampler.set_start(640)      # ... from its 641st index on (a checkpoint taken mid-epoch)
    loader = DataLoader(dataset, batch_size=64, sampler=sampler)

Splits (subset fractions, k-fold folds) are seeded by their own `split_seed` instead, so that
a train/validation split of one set is the same in every run whatever the run seed.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Mapping

import torch
from torch.utils.data import Sampler

from torchloom.config.sampler_schema import (
    KFoldSamplerConfig,
    RandomSamplerConfig,
    SamplerConfig,
    SequentialSamplerConfig,
    SubsetSamplerConfig,
    WeightedSamplerConfig,
)
from torchloom.errors import DataError, Where

# Seeds are folded into torch's accepted range; 1_000_003 is prime, so distinct small
# (seed, epoch) pairs never collide.
_SEED_MULTIPLIER = 1_000_003
_SEED_MODULUS = 2**63
# Keeps a split's permutation unrelated to the run's permutation when split_seed == seed.
_SPLIT_SALT = 0x5EED_5B17


def _generator(*parts: int) -> torch.Generator:
    """A fresh CPU generator seeded from `parts` alone (never from global RNG state)."""
    value = 0
    for part in parts:
        value = (value * _SEED_MULTIPLIER + part) % _SEED_MODULUS
    generator = torch.Generator()
    generator.manual_seed(value)
    return generator


def _split_permutation(size: int, split_seed: int) -> torch.Tensor:
    return torch.randperm(size, generator=_generator(_SPLIT_SALT, split_seed))


class ResumableSampler(Sampler[int]):
    """Dataset indices for one epoch; the order depends only on (seed, epoch)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.seed = seed
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order to produce; also resets the start position to 0."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self.epoch = epoch
        self.start = 0

    def set_start(self, position: int) -> None:
        """Skip the first `position` indices of the current epoch (resume mid-epoch)."""
        length = self.epoch_length()
        if not 0 <= position <= length:
            raise ValueError(f"start position {position} is outside 0..{length} (epoch length)")
        self.start = position

    @abstractmethod
    def epoch_length(self) -> int:
        """Indices in a full epoch (may depend on the epoch, e.g. k-fold with uneven folds)."""

    def epoch_lengths(self) -> set[int]:
        """Every length an epoch of this sampler may have (k-fold: one per held-out fold)."""
        return {self.epoch_length()}

    @abstractmethod
    def _order(self, epoch: int) -> torch.Tensor:
        """The full, deterministic index order of `epoch` (1-D int64)."""

    def __len__(self) -> int:
        """Indices still to come this epoch (what a DataLoader's length should count)."""
        return self.epoch_length() - self.start

    def __iter__(self) -> Iterator[int]:
        # Snapshot now, so set_epoch/set_start during iteration cannot tear the order.
        return iter(self._order(self.epoch)[self.start :].tolist())

    def positioned(self) -> Iterator[tuple[int, int]]:
        """(position in the epoch's order, index) of each index `__iter__` gives."""
        return enumerate(self._order(self.epoch)[self.start :].tolist(), start=self.start)

    def _reshuffled(self, indices: torch.Tensor, epoch: int) -> torch.Tensor:
        """`indices` in an order drawn from (seed, epoch)."""
        permutation = torch.randperm(len(indices), generator=_generator(self.seed, epoch))
        return indices[permutation]


class SequentialSampler(ResumableSampler):
    """0, 1, ..., size - 1 every epoch."""

    def __init__(self, size: int) -> None:
        super().__init__(seed=0)
        self.size = size

    def epoch_length(self) -> int:
        return self.size

    def _order(self, epoch: int) -> torch.Tensor:
        return torch.arange(self.size)


class RandomSampler(ResumableSampler):
    """Every index once per epoch, in a permutation drawn from (seed, epoch)."""

    def __init__(self, size: int, seed: int) -> None:
        super().__init__(seed)
        self.size = size

    def epoch_length(self) -> int:
        return self.size

    def _order(self, epoch: int) -> torch.Tensor:
        return torch.randperm(self.size, generator=_generator(self.seed, epoch))


class SubsetSampler(ResumableSampler):
    """A fixed set of indices, visited as given or reshuffled every epoch."""

    def __init__(self, indices: torch.Tensor, seed: int, shuffle: bool) -> None:
        super().__init__(seed)
        self.indices = indices
        self.shuffle = shuffle

    def epoch_length(self) -> int:
        return len(self.indices)

    def _order(self, epoch: int) -> torch.Tensor:
        return self._reshuffled(self.indices, epoch) if self.shuffle else self.indices


class WeightedSampler(ResumableSampler):
    """`num_samples` draws per epoch, each index with probability proportional to its weight."""

    def __init__(
        self, weights: torch.Tensor, num_samples: int, replacement: bool, seed: int
    ) -> None:
        super().__init__(seed)
        self.weights = weights
        self.num_samples = num_samples
        self.replacement = replacement

    def epoch_length(self) -> int:
        return self.num_samples

    def _order(self, epoch: int) -> torch.Tensor:
        return torch.multinomial(
            self.weights, self.num_samples, self.replacement, generator=_generator(self.seed, epoch)
        )


class KFoldSampler(ResumableSampler):
    """The training folds, or the held-out fold, of the rotation that `epoch` falls in."""

    def __init__(
        self,
        folds: list[torch.Tensor],
        held_out: bool,
        epochs_per_fold: int,
        seed: int,
        shuffle: bool,
    ) -> None:
        super().__init__(seed)
        self.folds = folds
        self.held_out = held_out
        self.epochs_per_fold = epochs_per_fold
        self.shuffle = shuffle

    def held_out_fold(self, epoch: int) -> int:
        """Which fold is held out in `epoch`."""
        return (epoch // self.epochs_per_fold) % len(self.folds)

    def _indices(self, epoch: int) -> torch.Tensor:
        held = self.held_out_fold(epoch)
        if self.held_out:
            return self.folds[held]
        # Sorted, so that an unshuffled training epoch visits the data in dataset order.
        others = [fold for k, fold in enumerate(self.folds) if k != held]
        return torch.cat(others).sort().values

    def epoch_length(self) -> int:
        return self._length(self.held_out_fold(self.epoch))

    def epoch_lengths(self) -> set[int]:
        return {self._length(fold) for fold in range(len(self.folds))}

    def _length(self, fold: int) -> int:
        held = len(self.folds[fold])
        return held if self.held_out else sum(len(f) for f in self.folds) - held

    def _order(self, epoch: int) -> torch.Tensor:
        indices = self._indices(epoch)
        return self._reshuffled(indices, epoch) if self.shuffle else indices


def build_sampler(
    config: SamplerConfig | None,
    dataset_size: int,
    *,
    seed: int,
    shuffle: bool,
    targets: torch.Tensor | None = None,
    where: str = "",
) -> ResumableSampler:
    """The sampler that `config` describes, checked against the dataset it will index.

    config None: random when `shuffle` else sequential. For subset and kfold, a `shuffle` the
    config leaves out follows this `shuffle` (the dataloader's); one it sets wins.
    `targets` (1-D integers, one class per sample) is only needed by `class_balanced`.
    Raises DataError (located at `where`) when the config does not fit the dataset.
    """
    if dataset_size <= 0:
        raise DataError.at(where, "sampler", f"the dataset is empty (size {dataset_size})")
    if config is None:
        config = RandomSamplerConfig() if shuffle else SequentialSamplerConfig()
    if isinstance(config, RandomSamplerConfig):
        return RandomSampler(dataset_size, seed)
    if isinstance(config, SequentialSamplerConfig):
        return SequentialSampler(dataset_size)
    if isinstance(config, SubsetSamplerConfig):
        indices = _subset_indices(config, dataset_size, where)
        return SubsetSampler(indices, seed, _shuffles(config, shuffle))
    if isinstance(config, WeightedSamplerConfig):
        return _weighted_sampler(config, dataset_size, seed, targets, where)
    if isinstance(config, KFoldSamplerConfig):
        folds = _folds(config, dataset_size, where)
        return KFoldSampler(
            folds, config.held_out, config.epochs_per_fold, seed, _shuffles(config, shuffle)
        )
    raise TypeError(f"unknown sampler config {type(config).__name__}")


def _shuffles(config: SubsetSamplerConfig | KFoldSamplerConfig, loader_shuffle: bool) -> bool:
    # An explicit setting in the sampler entry is the more specific one; otherwise defer.
    return config.shuffle if "shuffle" in config.model_fields_set else loader_shuffle


def _subset_indices(config: SubsetSamplerConfig, size: int, where: str) -> torch.Tensor:
    if config.indices is not None:
        bad = next((i for i in config.indices if not 0 <= i < size), None)
        if bad is not None:
            raise DataError.at(
                where,
                "sampler.indices",
                f"index {bad} is out of range for a dataset of size {size}",
                f"indices must lie in 0..{size - 1}",
            )
        chosen = torch.tensor(config.indices, dtype=torch.int64)
        what = f"the {len(config.indices)} listed indices"
    else:
        assert config.fraction is not None  # the schema guarantees one of the two
        count = round(config.fraction * size)
        # Sorted, so that an unshuffled subset visits the data in dataset order.
        chosen = _split_permutation(size, config.split_seed)[:count].sort().values
        what = f"fraction {config.fraction} of {size} samples ({count})"
    if config.complement:
        keep = torch.ones(size, dtype=torch.bool)
        keep[chosen] = False
        chosen = keep.nonzero().flatten()
        what = f"the complement of {what}"
    if len(chosen) == 0:
        raise DataError.at(
            where,
            "sampler",
            f"the subset is empty: {what} selects no sample",
            "choose a fraction or indices that leave samples on both sides",
        )
    return chosen


def _folds(config: KFoldSamplerConfig, size: int, where: str) -> list[torch.Tensor]:
    if config.folds > size:
        raise DataError.at(
            where,
            "sampler.folds",
            f"{config.folds} folds of a dataset of size {size} leave some fold empty",
            f"use at most {size} folds",
        )
    pieces = torch.tensor_split(_split_permutation(size, config.split_seed), config.folds)
    # Sorted, so that an unshuffled held-out fold is visited in dataset order.
    return [piece.sort().values for piece in pieces]


def _weighted_sampler(
    config: WeightedSamplerConfig, size: int, seed: int, targets: torch.Tensor | None, where: str
) -> WeightedSampler:
    if config.weights is not None:
        if len(config.weights) != size:
            raise DataError.at(
                where,
                "sampler.weights",
                f"{len(config.weights)} weights given for a dataset of size {size}",
                "give exactly one weight per sample",
            )
        weights = torch.tensor(config.weights, dtype=torch.float64)
    else:
        weights = _class_balanced_weights(targets, size, where)
    num_samples = config.num_samples if config.num_samples is not None else size
    drawable = int((weights > 0).sum())
    if not config.replacement and num_samples > drawable:
        raise DataError.at(
            where,
            "sampler.num_samples",
            f"{num_samples} draws without replacement, but only {drawable} samples have a "
            "weight above zero",
            "lower num_samples or set replacement: true",
        )
    return WeightedSampler(weights, num_samples, config.replacement, seed)


def _class_balanced_weights(targets: torch.Tensor | None, size: int, where: str) -> torch.Tensor:
    """1 / (count of the sample's class) for every sample: each class gets equal total mass."""
    if targets is None:
        raise DataError.at(
            where,
            "sampler.class_balanced",
            "the task does not expose per-sample targets, so classes cannot be balanced",
            "give explicit 'weights' instead, or use a task that exposes its targets",
        )
    if targets.dim() != 1 or targets.is_floating_point() or targets.is_complex():
        raise DataError.at(
            where,
            "sampler.class_balanced",
            f"targets must be a 1-D integer tensor (one class per sample), got shape "
            f"{tuple(targets.shape)} of {targets.dtype}",
        )
    if len(targets) != size:
        raise DataError.at(
            where,
            "sampler.class_balanced",
            f"the task exposes {len(targets)} targets for a dataset of size {size}",
        )
    _, inverse, counts = torch.unique(targets, return_inverse=True, return_counts=True)
    return 1.0 / counts.to(torch.float64)[inverse]


def check_split_sizes(
    sizes: Mapping[str, int], samplers: Mapping[str, SamplerConfig | None], where: Where
) -> None:
    """A DataError when two sections' drawn split disagrees. A subset by `fraction` and
    k-fold permute the dataset's positions with `split_seed`: a section holding out the other
    side (`complement`, `held_out`) agrees with one that trains on it only over datasets of
    the same size; over two sizes (a `task.subset` in one section only) the sides overlap."""
    drawn = {
        section: (
            config.split_seed,
            bool(getattr(config, "complement", False) or getattr(config, "held_out", False)),
        )
        for section, config in samplers.items()
        if isinstance(config, KFoldSamplerConfig)
        or (isinstance(config, SubsetSamplerConfig) and config.fraction is not None)
    }
    for section, (seed, out) in drawn.items():
        for other, (other_seed, other_out) in drawn.items():
            if out and not other_out and seed == other_seed and sizes[section] != sizes[other]:
                raise DataError.at(
                    where(section, "sampler"),
                    f"{section}.sampler",
                    f"holds out the side of a split that {other}.sampler trains on, over "
                    f"{sizes[section]} samples where {other} has {sizes[other]}: the split is "
                    "drawn over the dataset's size, so the two sides overlap",
                    "give both sections' tasks the same subset (or none)",
                )
