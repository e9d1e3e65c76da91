"""The schema of `training.dataloader.reservoir` and the checks across sections that a
reservoir needs: combinations whose results would be wrong are config errors that `loom
check` reports before any data is read. Like the rest of the config package this module
imports no torch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from torchloom.config_model import ConfigModel, refuse_too_many_workers
from torchloom.errors import Problem, Where


class ReservoirConfig(ConfigModel):
    """`training.dataloader.reservoir`: worker processes keep a reservoir of processed
    (augmented) samples filled, and training draws its batches from it without waiting for
    them (data/reservoir.py)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    size: int = Field(
        gt=0,
        description="samples the reservoir holds (at least batch_size, at most the training "
        "set's length)",
    )
    replacement_rate: float = Field(
        0.1,
        gt=0,
        le=1,
        description="at most this fraction of the reservoir is replaced by new samples per step",
    )
    workers: int = Field(2, ge=1, description="worker processes that produce samples")
    deterministic: bool = Field(
        False,
        description="wait for exactly the samples a step is due (in order), so that a run does "
        "not depend on timing: for tests and exact comparisons, slower",
    )
    _bounded_workers = field_validator("workers")(refuse_too_many_workers)


def reservoir_problems(sections: Mapping[str, BaseModel], where: Where) -> list[Problem]:
    """What a reservoir cannot be combined with, each naming the reservoir's key."""
    training: Any = sections.get("training")
    reservoir = training.dataloader.reservoir if training is not None else None
    if reservoir is None:
        return []
    key, shown = where("training", "dataloader", "reservoir"), "training.dataloader.reservoir"
    problems = []
    sampler = getattr(training.sampler, "type", None)
    if sampler == "kfold":
        # The reservoir's workers step the sampler by their own virtual epochs, which run
        # ahead of the training's, and samples of earlier folds stay in the reservoir: the
        # fold validation holds out would be trained on.
        problems.append(
            Problem(
                key,
                shown,
                "cannot be combined with training.sampler kfold: the reservoir steps the "
                "sampler by its own virtual epochs and keeps samples of earlier folds, so the "
                "held-out fold validation visits would be trained on",
                "remove the reservoir for a k-fold run, or use another sampler",
            )
        )
    if training.deterministic and not reservoir.deterministic:
        # Which samples fill the reservoir, and in which order, follows the workers' timing.
        problems.append(
            Problem(
                where("training", "dataloader", "reservoir", "deterministic"),
                f"{shown}.deterministic",
                "is false, and training.deterministic is true: which samples a step draws "
                "would follow the workers' timing, so the run would not depend on its seed alone",
                f"set {shown}.deterministic: true (slower when the workers are), or "
                "training.deterministic: false",
            )
        )
    return problems
