"""Typed schemas of a section's `sampler:` entry: which dataset indices an epoch visits.

    sampler: {type: subset, fraction: 0.9}                    # training: 90% of the set
    sampler: {type: subset, fraction: 0.9, complement: true}  # validation: the other 10%

Checks that need no data (exclusive fields, ranges) live here; checks that need the dataset
(its size, its targets) happen in `torchloom.data.samplers.build_sampler`. Like the rest of
the config package this module never imports torch, so `loom check` stays fast.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from torchloom.config_model import refuse_a_boolean_for_a_number

# Shared by subset and kfold. Leaving `shuffle` out defers to the dataloader so that the
# usual validation split ({fraction: 0.9, complement: true}) is visited in order by default.
SHUFFLE_DESCRIPTION = (
    "reshuffle the selected indices every epoch (from the run seed and the epoch); when "
    "left out, follows the dataloader's `shuffle` (on for training, off otherwise)"
)


# The samplers' number fields: a boolean there is refused (`split_seed: true` was seed 1). Not
# config_model.ConfigModel's every-field validator, which pydantic refuses on the union's tag
# `type`; tests/config/test_config_booleans.py checks that this lists every number field.
NUMBER_FIELDS = (
    "indices",
    "fraction",
    "split_seed",
    "weights",
    "num_samples",
    "folds",
    "epochs_per_fold",
)


class _Strict(BaseModel):
    # A misspelt key must be an error, never a silently ignored setting.
    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use: faster import
    _no_boolean_for_a_number = field_validator(*NUMBER_FIELDS, mode="before", check_fields=False)(
        refuse_a_boolean_for_a_number
    )


class RandomSamplerConfig(_Strict):
    """Every sample once per epoch, in an order drawn from (run seed, epoch)."""

    type: Literal["random"] = Field("random", description="sampler kind")


class SequentialSamplerConfig(_Strict):
    """Every sample once per epoch, in dataset order."""

    type: Literal["sequential"] = Field("sequential", description="sampler kind")


class SubsetSamplerConfig(_Strict):
    """A fixed part of the dataset: listed indices, or a seeded fraction of it."""

    type: Literal["subset"] = Field("subset", description="sampler kind")
    indices: list[int] | None = Field(
        None, description="dataset indices to visit (exclusive with `fraction`)"
    )
    fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="visit the first round(fraction * size) items of a permutation of the "
        "dataset seeded by `split_seed` (exclusive with `indices`)",
    )
    complement: bool = Field(
        False, description="visit every index the subset does NOT select (e.g. validation)"
    )
    split_seed: int = Field(
        0,
        description="seed of the `fraction` split; independent of the run seed so that a "
        "train/validation split of one set is the same in every run",
    )
    shuffle: bool = Field(True, description=SHUFFLE_DESCRIPTION)

    @model_validator(mode="after")
    def _exactly_one_selection(self) -> SubsetSamplerConfig:
        if self.indices is not None and self.fraction is not None:
            raise ValueError("'indices' and 'fraction' are exclusive: set only one of them")
        if self.indices is None and self.fraction is None:
            raise ValueError("set one of 'indices' (a list) or 'fraction' (0 < f <= 1)")
        return self

    @field_validator("indices")
    @classmethod
    def _no_duplicates(cls, indices: list[int] | None) -> list[int] | None:
        # A repeated index would silently over-weight a sample; weighting is `weighted`'s job.
        if indices is not None:
            seen: set[int] = set()
            for index in indices:
                if index in seen:
                    raise ValueError(f"index {index} is listed twice in 'indices'")
                seen.add(index)
        return indices


class WeightedSamplerConfig(_Strict):
    """Samples drawn with probability proportional to a weight (over- or under-sampling)."""

    type: Literal["weighted"] = Field("weighted", description="sampler kind")
    weights: list[float] | None = Field(
        None, description="one weight >= 0 per sample (exclusive with `class_balanced`)"
    )
    class_balanced: bool = Field(
        False,
        description="weight each sample by 1 / (count of its class) so that every class is "
        "drawn about equally often; needs a task with per-sample targets",
    )
    num_samples: int | None = Field(
        None, gt=0, description="draws per epoch (default: the dataset size)"
    )
    replacement: bool = Field(True, description="draw with replacement")

    @field_validator("weights")
    @classmethod
    def _valid_weights(cls, weights: list[float] | None) -> list[float] | None:
        if weights is None:
            return None
        for i, weight in enumerate(weights):
            if not math.isfinite(weight) or weight < 0:
                raise ValueError(f"weights[{i}] is {weight}; every weight must be finite and >= 0")
        if not any(w > 0 for w in weights):
            raise ValueError("'weights' are all zero: nothing could ever be drawn")
        return weights

    @model_validator(mode="after")
    def _exactly_one_weighting(self) -> WeightedSamplerConfig:
        if self.weights is not None and self.class_balanced:
            raise ValueError("'weights' and 'class_balanced' are exclusive: set only one of them")
        if self.weights is None and not self.class_balanced:
            raise ValueError("set one of 'weights' (a list) or 'class_balanced: true'")
        return self


class KFoldSamplerConfig(_Strict):
    """Cross-validation: the set is cut into folds, and one fold is held out per rotation.

    In epoch e the held-out fold is (e // epochs_per_fold) % folds. Training (held_out=False)
    visits every other fold and validation (held_out=True) the held-out one: give both
    sections the same folds, epochs_per_fold and split_seed and they agree by construction.
    """

    type: Literal["kfold"] = Field("kfold", description="sampler kind")
    folds: int = Field(5, ge=2, description="number of folds")
    held_out: bool = Field(
        False, description="visit the held-out fold (validation) instead of the others"
    )
    epochs_per_fold: int = Field(
        1, ge=1, description="epochs before the held-out fold moves on to the next"
    )
    split_seed: int = Field(
        0, description="seed of the cut into folds; independent of the run seed"
    )
    shuffle: bool = Field(True, description=SHUFFLE_DESCRIPTION)


SamplerConfig = Annotated[
    RandomSamplerConfig
    | SequentialSamplerConfig
    | SubsetSamplerConfig
    | WeightedSamplerConfig
    | KFoldSamplerConfig,
    Field(discriminator="type"),
]
