"""Typed schemas of the config's sections. Unknown keys are errors with a suggestion.

Component entries (`task`, `pipeline.*`) are validated by each component's own `Params`
when the pipeline is built; this module checks everything around them. It imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from torchloom.config.architecture_search_schema import ArchitectureSearchConfig
from torchloom.config.reservoir_schema import ReservoirConfig, reservoir_problems
from torchloom.config.sampler_schema import SamplerConfig
from torchloom.config_model import ConfigModel, refuse_too_many_workers
from torchloom.errors import ConfigError, Problem, Where, did_you_mean, validation_problems
from torchloom.run_names import run_name_problem, shown


class _Strict(ConfigModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use: faster import


class DataLoaderConfig(_Strict):
    """Arguments of the section's torch DataLoader."""

    batch_size: int = Field(64, gt=0, description="samples per batch")
    shuffle: bool | None = Field(None, description="reshuffle each epoch (default: training only)")
    num_workers: int = Field(0, ge=0, description="loader worker processes")
    pin_memory: bool = Field(
        False,
        description="page-locked host memory for faster GPU copies (a run on the host pins "
        "nothing)",
    )
    persistent_workers: bool = Field(False, description="keep workers alive between epochs")
    drop_last: bool = Field(False, description="drop the last incomplete batch")
    reservoir: ReservoirConfig | None = Field(
        None, description="training only: draw batches from an asynchronous reservoir"
    )
    on_device: bool = Field(
        False,
        description="keep the task's data on the run's device and gather each batch there "
        "(tasks that hold their split as tensors: MNIST, Fashion-MNIST, CIFAR, "
        "Sort-of-CLEVR): no batch is built on the host or copied to a GPU in the loop",
    )

    _bounded_workers = field_validator("num_workers")(refuse_too_many_workers)

    @model_validator(mode="after")
    def _reservoir_holds_a_batch(self) -> DataLoaderConfig:
        if self.reservoir is not None and self.reservoir.size < self.batch_size:
            raise ValueError(
                f"reservoir.size {self.reservoir.size} is smaller than batch_size "
                f"{self.batch_size}: the reservoir must hold a batch (a few is usual)"
            )
        return self

    @model_validator(mode="after")
    def _on_device_reads_in_this_process(self) -> DataLoaderConfig:
        # Batches gathered on a GPU cannot come from worker processes (CUDA does not cross
        # a fork) nor from the reservoir's (they build samples on the host), and are never
        # in host memory to pin: each of these keys would be ignored, so each is refused.
        if not self.on_device:
            return self
        if self.num_workers:
            raise ValueError(
                f"on_device gathers batches in this process, so num_workers "
                f"{self.num_workers} would have nothing to do: set num_workers: 0 or "
                "on_device: false"
            )
        if self.reservoir is not None:
            raise ValueError(
                "on_device and reservoir cannot be combined (the reservoir's workers build "
                "samples on the host): remove one"
            )
        if self.pin_memory:
            raise ValueError(
                "on_device leaves nothing to pin (no batch is in host memory): remove "
                "pin_memory or on_device"
            )
        return self


class OptimizerConfig(ConfigModel):
    """`type` names a torch.optim class; every other key is passed to it (checked there)."""

    model_config = ConfigDict(extra="allow", defer_build=True)
    type: str = Field("Adam", description="torch.optim class name, e.g. Adam, SGD, AdamW")
    param_groups: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="per-component optimizer settings, e.g. {encoder: {lr: 1.0e-4}}",
    )


class SchedulerConfig(ConfigModel):
    """`type` names a torch.optim.lr_scheduler class; other keys are passed to it."""

    model_config = ConfigDict(extra="allow", defer_build=True)
    type: str = Field(description="lr_scheduler class name, e.g. StepLR, CosineAnnealingLR")
    interval: Literal["epoch", "step"] = Field("epoch", description="when to step it")


class GradientClippingConfig(_Strict):
    norm: float | None = Field(None, gt=0, description="clip the total gradient norm to this")
    value: float | None = Field(None, gt=0, description="clip every gradient element to ±this")
    norm_type: float = Field(2.0, gt=0, description="p of the p-norm used with `norm`")


class DistributedConfig(_Strict):
    """`training.distributed`: how several processes (`loom train --nproc N`) share a run."""

    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="ddp: every process holds the whole model (DistributedDataParallel); "
        "fsdp: parameters, gradients and optimizer states are sharded among the processes "
        "(FSDP2, fully_shard) and last.pt's weights are saved as shards "
        "(torch.distributed.checkpoint)",
    )


class EarlyStoppingConfig(_Strict):
    monitor: str = Field(description="statistic to watch, e.g. validation.accuracy")
    mode: Literal["min", "max"] = Field("min", description="whether lower or higher is better")
    patience: int = Field(3, ge=0, description="evaluations without improvement before stopping")
    min_delta: float = Field(0.0, ge=0, description="smallest change that counts as better")


class TerminalConditions(_Strict):
    epoch_limit: int | None = Field(None, gt=0, description="stop after this many epochs")
    episode_limit: int | None = Field(None, gt=0, description="stop after this many batches")
    loss_stop_threshold: float | None = Field(
        None,
        description="converged once the monitored loss (validation, else training) "
        "falls below this",
    )
    early_stopping: EarlyStoppingConfig | None = None


class SectionConfig(_Strict):
    task: dict[str, Any] = Field(description="the data source: a Task component entry")
    dataloader: DataLoaderConfig = Field(default_factory=DataLoaderConfig)
    sampler: SamplerConfig | None = Field(None, description="which indices an epoch visits")


class TrainingConfig(SectionConfig):
    mode: Literal["offline", "online"] = Field(
        "offline",
        description="offline: full validation after every epoch; online: partial "
        "validation every validation.partial_validation_interval episodes",
    )
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig | None = None
    gradient_clipping: GradientClippingConfig | None = None
    gradient_accumulation: int = Field(1, ge=1, description="batches per optimizer step")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="autocast dtype; fp16 adds a GradScaler"
    )
    seed: int | None = Field(
        None,
        ge=0,
        description="seed of every random generator; drawn "
        "and recorded in the run's config.yaml when left out",
    )
    deterministic: bool = Field(False, description="torch.use_deterministic_algorithms")
    compile: bool | dict[str, Any] = Field(
        False,
        description="torch.compile the pipeline's models: true, or torch.compile's arguments "
        "such as {mode: reduce-overhead}",
    )
    logging_interval: int = Field(100, gt=0, description="episodes between statistics rows")
    checkpoint_interval: int | None = Field(
        None,
        gt=0,
        description="episodes between mid-epoch saves of last.pt (always saved "
        "at the end of an epoch)",
    )
    loss_weights: dict[str, float] = Field(
        default_factory=dict,
        description="weight per loss component name (default 1.0); the "
        "weighted sum is minimised in one backward pass",
    )
    terminal_conditions: TerminalConditions = Field(default_factory=TerminalConditions)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    architecture_search: ArchitectureSearchConfig | None = Field(
        None,
        description="learn a DARTS architecture while training: see docs/architecture-search.md",
    )


class ValidationConfig(SectionConfig):
    partial_validation_interval: int | None = Field(
        None, gt=0, description="online mode: episodes between partial validations"
    )
    partial_validation_batches: int = Field(
        10, gt=0, description="online mode: batches in a partial validation"
    )


# config.yaml's record of how a code-first run (Trainer.fit) builds its module and data
# (engine/code_first_sources.py).
CODE_FIRST_KEY = "code_first"

TOP_LEVEL_KEYS: dict[str, type[BaseModel] | None] = {
    "name": None,
    "training": TrainingConfig,
    "validation": ValidationConfig,
    "test": SectionConfig,
    "pipeline": None,
    "analysis": None,  # validated by torchloom.analysis (its schema lives with its hooks)
    "search": None,  # a hyper-parameter search space, validated by torchloom.search
}


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """Every pydantic model inside an annotation (`SamplerConfig` is a union of several)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for argument in get_args(annotation) for model in _models_in(argument)]


def schema_fields(path: tuple[str, ...]) -> list[str]:
    """The keys the section schemas declare in the mapping at `path` (the top-level keys for
    `()`, `seed`, `optimizer`, ... for `("training",)`), whether a file sets them or not.
    Component entries and torch's own arguments (`training.optimizer.momentum`) are not in
    these schemas: [] for them."""
    if not path:
        return list(TOP_LEVEL_KEYS)
    models = [m for m in [TOP_LEVEL_KEYS.get(path[0])] if m is not None]
    for part in path[1:]:
        fields = [m.model_fields[part] for m in models if part in m.model_fields]
        models = [model for f in fields for model in _models_in(f.annotation)]
    return list(dict.fromkeys(name for model in models for name in model.model_fields))


def validate_sections(
    data: Mapping[str, Any], where: Where, for_training: bool = True
) -> dict[str, BaseModel]:
    """Check the top-level keys and every section; return the typed sections by name.
    `for_training=False` (a trained run read to evaluate or deploy) leaves out what concerns
    training's loading only: a run trained before such a check was added stays usable."""
    if CODE_FIRST_KEY in data:
        # A Trainer.fit run's record: its pipeline is Python code, not a config to train or
        # check, and "unknown top-level section" would not say so.
        raise ConfigError.at(
            where(CODE_FIRST_KEY),
            "this config",
            "is that of a run of torchloom.Trainer(...).fit(...): its pipeline is a Python "
            "module, not a config a YAML command trains or checks",
            "continue it in Python with torchloom.Trainer(...).fit(..., resume=RUN_DIR), or "
            "evaluate it with `loom process RUN_DIR`",
        )
    problems: list[Problem] = []
    sections: dict[str, BaseModel] = {}
    for key, value in data.items():
        if key not in TOP_LEVEL_KEYS:
            problems.append(
                Problem(
                    where(key),
                    f"key '{key}'",
                    "unknown top-level section",
                    did_you_mean(key, TOP_LEVEL_KEYS) or f"sections: {', '.join(TOP_LEVEL_KEYS)}",
                )
            )
            continue
        model = TOP_LEVEL_KEYS[key]
        if model is None:
            continue
        if not isinstance(value, Mapping):
            problems.append(Problem(where(key), f"section '{key}'", "must be a mapping"))
            continue
        try:
            sections[key] = model.model_validate(dict(value))
        except ValidationError as error:
            problems += validation_problems(error, where, (key,), model, unions={"sampler"})
    name = data.get("name")
    if name is not None and not (isinstance(name, str) and name.strip()):
        problems.append(Problem(where("name"), "key 'name'", "must be a non-empty string"))
    elif isinstance(name, str) and run_name_problem(name):
        problems.append(
            Problem(
                where("name"),
                f"key 'name' {shown(name)}",
                f"names the run folders, and {run_name_problem(name)}",
                "use letters, digits, '_', '-' and '.' (not first)",
            )
        )
    training = sections.get("training")
    if (
        isinstance(training, TrainingConfig)
        and training.mode == "online"
        and ("validation" not in data)
    ):
        problems.append(
            Problem(
                where("training", "mode"),
                "training.mode",
                "is online, which validates part of the validation set every few episodes, "
                "and this config has no validation section",
                "add a validation section, or use mode: offline",
            )
        )
    if for_training:
        problems += reservoir_problems(sections, where)
    if "pipeline" in data and not isinstance(data["pipeline"], Mapping):
        problems.append(
            Problem(
                where("pipeline"),
                "section 'pipeline'",
                "must be a mapping of component names to their configs",
            )
        )
    if problems:
        raise ConfigError(problems)
    return sections
