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
        description="samples the reservoir holds (at least batch_size; bounded by the memory "
        "they take)",
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
    """What a reservoir cannot be combined with, each naming the key at fault."""
    problems = [
        Problem(
            where(section, "dataloader", "reservoir"),
            f"{section}.dataloader.reservoir",
            "is for training only (a pass that evaluates visits every sample once)",
            "remove it here",
        )
        for section in ("validation", "test")
        if getattr(getattr(sections.get(section), "dataloader", None), "reservoir", None)
    ]
    training: Any = sections.get("training")
    reservoir = training.dataloader.reservoir if training is not None else None
    if reservoir is None:
        return problems
    key, shown = where("training", "dataloader", "reservoir"), "training.dataloader.reservoir"
    # Training's batches come from the reservoir's workers, so the loader's would be ignored
    # (num_workers: 8 trained with reservoir.workers' default); passes that read the task
    # directly (loom process, the learning-rate finder) read it in this process then.
    loader_keys = {
        "num_workers": training.dataloader.num_workers > 0,
        "persistent_workers": training.dataloader.persistent_workers,
    }
    problems += [
        Problem(
            where("training", "dataloader", name),
            f"training.dataloader.{name}",
            "configures the loader's workers, and with a reservoir the reservoir's workers "
            "make the training's batches (it would be ignored)",
            f"set training.dataloader.{name}={off} (an override does, when a default config "
            f"sets it); {shown}.workers sets how many workers make samples",
        )
        for (name, used), off in zip(loader_keys.items(), ("0", "false"), strict=True)
        if used
    ]
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
                f"set {shown}.deterministic: true (a step then waits for its samples), or "
                "training.deterministic: false",
            )
        )
    return problems
