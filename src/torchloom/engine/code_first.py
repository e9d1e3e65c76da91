"""Training a plain `nn.Module` on plain datasets through the same engine as YAML pipelines
(Torch Research Workflows' code-first style).

    trainer = torchloom.Trainer(epochs=3, batch_size=64, optimizer={"type": "Adam", "lr": 1e-3})
    result = trainer.fit(Net(), train=train_set, validation=validation_set)

The module and datasets become a pipeline (engine/code_first_pipeline.py), which goes through
the same loop, checkpoints and run folder as a config's.
"""

from __future__ import annotations

import copy
import numbers
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from torch import nn

from torchloom.config import dump_config
from torchloom.config.dumping import plain_config_data
from torchloom.config.schema import SectionConfig, TrainingConfig, ValidationConfig
from torchloom.config.yaml_reader import parse_config_text
from torchloom.core import outputs
from torchloom.core.pipeline import Pipeline
from torchloom.engine.checkpoint import seed_everything
from torchloom.engine.code_first_pipeline import (
    BUILT_IN_PYTHON,
    INDICES,
    build_pipeline,
    declared_outputs,
    has_loss,
)
from torchloom.engine.code_first_pipeline import fit_where as _where
from torchloom.engine.code_first_sources import (
    FIT_ARGUMENT,
    describe_module,
    open_dataset,
    seed_for_section,
)
from torchloom.engine.code_first_sources import KEY as SOURCES
from torchloom.engine.resume import check_resumed_config, finished_result
from torchloom.engine.run_folder import RunResult
from torchloom.engine.setup import ResumePoint, open_resume_point, start_run
from torchloom.engine.state import Hook, TrainOptions
from torchloom.engine.trainer import TrainingLoop
from torchloom.errors import ConfigError, Where, validation_problems

ANALYSIS = "Trainer(analysis=...)"
HookFactory = Callable[[Mapping[str, Any], Pipeline, Where], Sequence[Hook]]


def _training_settings(
    epochs: int | None, batch_size: int | None, given: Mapping[str, Any]
) -> dict[str, Any]:
    """The training section of Trainer(...)'s keywords: a plain copy (the caller's mappings,
    perhaps shared with another Trainer, are never filled in), with the shortcuts in place. A
    shortcut that contradicts its key, and `task`, are refused: either would be a setting
    the run silently does not use."""
    # Plain values, as a config read from YAML holds (numpy numbers are not taken by every
    # torch optimizer, nor written by yaml), in a new mapping: never the caller's own.
    training = plain_config_data(given, "Trainer(...)")
    if "task" in training:
        raise ConfigError.at(
            "Trainer(...)",
            "Trainer(task=...)",
            "is not a Trainer setting: a code-first run trains on the datasets given to fit",
            "leave out task and pass the data to fit(module, train=..., validation=...)",
        )
    shortcuts = (
        ("batch_size", batch_size, "dataloader", 64),
        ("epochs", epochs, "terminal_conditions", None),
    )
    for shortcut, value, key, default in shortcuts:
        inner = "batch_size" if shortcut == "batch_size" else "epoch_limit"
        section = training.setdefault(key, {})
        if not isinstance(section, Mapping):
            continue  # not a mapping: the schema's error names it
        if value is not None and inner in section and section[inner] != value:
            raise ConfigError.at(
                "Trainer(...)",
                f"Trainer({shortcut}={value!r})",
                f"contradicts {key}={{'{inner}': {section[inner]!r}}}",
                f"give one of them: {shortcut}= is a shortcut for {key}.{inner}",
            )
        chosen = value if value is not None else section.get(inner, default)
        if chosen is not None:
            training[key] = {**section, inner: chosen}
    return {"task": {"type": "python"}, **training}


# Settings of the evaluation sections, given to the Trainer beside the training section's
# keys: online mode's partial validations (a config's `validation:` keys), and the batch size
# of the validation and test passes (by default 64, a config section's default).
EVALUATION_KEYS = ("partial_validation_interval", "partial_validation_batches", "eval_batch_size")


def _evaluation_sections(given: Mapping[str, Any], training: Mapping[str, Any]) -> dict[str, Any]:
    """{section: its keys besides `task`} from the Trainer's evaluation settings, checked: a
    partial validation setting of an offline Trainer would be one the run does not use."""
    partial = {k: v for k, v in given.items() if k.startswith("partial_")}
    if partial and training.get("mode") != "online":
        raise ConfigError.at(
            "Trainer(...)",
            f"Trainer({next(iter(partial))}=...)",
            "sets online mode's partial validations, and this Trainer trains offline (a "
            "full validation after every epoch)",
            "add mode='online', or leave it out",
        )
    size = given.get("eval_batch_size")
    whole = isinstance(size, numbers.Integral) and not isinstance(size, bool)
    if size is not None and (not whole or size < 1):
        message = f"must be a whole number of samples above 0, got {size!r}"
        raise ConfigError.at("Trainer(...)", "Trainer(eval_batch_size=...)", message)
    size = int(size) if size is not None else None  # a numpy integer, as batch_size takes
    loader = {"batch_size": size} if size is not None else {}
    sections = {
        "validation": {**partial, **({"dataloader": loader} if loader else {})},
        "test": {"dataloader": loader} if loader else {},
    }
    for section, keys in sections.items():
        schema = ValidationConfig if section == "validation" else SectionConfig
        _checked(schema, {"task": {"type": "python"}, **keys})
    return sections


def _validated(settings: Mapping[str, Any]) -> TrainingConfig:
    """Trainer(...)'s keyword arguments, which are the training section's keys, validated."""
    validated = _checked(TrainingConfig, settings)
    assert isinstance(validated, TrainingConfig)
    return validated


def _checked(schema: type[BaseModel], settings: Mapping[str, Any]) -> BaseModel:
    """A section of Trainer(...)'s settings, validated; its errors name the Trainer."""
    try:
        return schema.model_validate(dict(settings))
    except ValidationError as error:
        problems = validation_problems(error, lambda *_: "Trainer(...)", (), schema)
        raise ConfigError(problems) from error


class CodeFirstTrainer:
    """Code-first training: `Trainer(**settings).fit(module, train=..., validation=...)`.

    Settings are the keys of a config's `training:` section (optimizer, scheduler, precision,
    gradient_clipping, ...), with `epochs` and `batch_size` as shortcuts, and the evaluation
    sections' `partial_validation_interval`, `partial_validation_batches` (online mode) and
    `eval_batch_size`; the run folder is `<expdir>/<name>/<timestamp>/` as for `loom train`.
    `analysis` is what a config's `analysis:` section holds (a preset name or a mapping; None:
    the default preset; False: none); its hooks come from `hook_factory`, which
    `torchloom.Trainer` sets (the engine never imports the analysis package)."""

    hook_factory: HookFactory | None = None

    def __init__(
        self,
        epochs: int | None = None,
        batch_size: int | None = None,
        *,
        name: str = "module",
        expdir: str | os.PathLike[str] = "runs",
        device: str | None = None,
        quiet: bool = True,
        tensorboard: int = 1,
        analysis: str | Mapping[str, Any] | bool | None = None,
        **training: Any,
    ) -> None:
        evaluation = {k: training.pop(k) for k in EVALUATION_KEYS if k in training}
        self.training = _training_settings(epochs, batch_size, training)
        _validated(self.training)  # a misspelt setting is an error here, not at fit()
        self.evaluation = _evaluation_sections(evaluation, self.training)
        self.name = name
        self.analysis = copy.deepcopy(analysis)  # the caller's mapping stays the caller's
        self.options = TrainOptions(
            expdir=str(expdir), device=device, quiet=quiet, tensorboard=tensorboard
        )

    def fit(
        self,
        module: nn.Module,
        train: Any,
        validation: Any = None,
        test: Any = None,
        resume: str | os.PathLike[str] | None = None,
    ) -> RunResult:
        """Train `module`; `resume` continues the run folder of an earlier fit of the same
        module class (its weights, optimizer, RNG and position come from its last.pt).

        A dataset is an object, or a zero-argument factory (a function or a Dataset class, or
        its `package.module:name`): a factory that imports is recorded in config.yaml, so
        `loom process RUN_DIR` can build the data again (see engine/code_first_sources.py)."""
        point = None
        if resume is not None:
            point = open_resume_point(Path(resume).expanduser(), f"fit(resume={resume!r})")
        try:
            given = {"training": train, "validation": validation, "test": test}
            prepared = self._prepare(module, given, point)
        except BaseException:
            if point is not None:
                point.lock.release()
            raise
        if isinstance(prepared, RunResult):  # a resumed run that had already finished
            if point is not None:
                point.lock.release()
            return prepared
        return prepared.run()

    def _prepare(
        self, module: nn.Module, given: Mapping[str, Any], point: ResumePoint | None
    ) -> TrainingLoop | RunResult:
        """The run of `fit`: its pipeline, config and loop (or the result of a resumed run
        that had already finished)."""
        # The validated seed: a numpy integer, 5.0 or "5" validate as the int 5, which is
        # the seed the run uses and records (only a Python int used to be taken). A resume
        # without one takes the run's: a drawn seed would be refused as a change.
        seed = _validated(self.training).seed
        if seed is None and point is not None:
            seed = _run_seed(point)
        seed = seed if seed is not None else secrets.randbelow(2**31)
        datasets, sources = {}, {}
        for section, value in given.items():
            if value is not None or section == "training":  # train=None: an error
                where, argument = _where(FIT_ARGUMENT[section]), f"fit({FIT_ARGUMENT[section]}=...)"
                seed_for_section(seed, section)  # as `loom process` opens it alone
                opened = open_dataset(value, section, where, argument)
                datasets[section], sources[section] = opened
        seed_everything(seed)  # before the dry run, which initialises Lazy layers
        pipeline = build_pipeline(module, datasets)
        declared = declared_outputs(pipeline)
        # This module's weights, for this fit only: the Trainer may fit another module next.
        weights = {f"{n}_loss": o.weight for n, o in declared.items() if has_loss(o)}
        weights.update(self.training.get("loss_weights") or {})
        config = _validated({**self.training, "loss_weights": weights, "seed": seed})
        if config.mode == "online" and "validation" not in pipeline.tasks:
            raise ConfigError.at(
                "Trainer(...)",
                "Trainer(mode='online')",
                "validates part of the validation set every few episodes, and fit was given "
                "no validation data",
                "give fit(..., validation=...), or leave out mode (offline)",
            )
        # Online mode reads the partial validation keys of the validation section's own
        # schema; an offline run's record keeps the plain section it always had (a run
        # recorded before stays resumable: an added key would be refused as a change).
        python_task = {"type": "python"}
        online = config.mode == "online"
        schemas = {
            "validation": ValidationConfig if online else SectionConfig,
            "test": SectionConfig,
        }
        # Only the keys given: a run recorded without them stays resumable.
        sections: dict[str, BaseModel] = {
            "training": config,
            **{
                s: m(task=python_task, **self.evaluation[s])
                for s, m in schemas.items()
                if s in pipeline.tasks
            },
        }
        analysis = self._analysis_section(declared)
        options = self.options
        if analysis is not None and self.hook_factory is not None:
            hooks = self.hook_factory({"analysis": analysis}, pipeline, lambda *_: ANALYSIS)
            options = replace(options, hooks=[*options.hooks, *hooks])
        record = {
            "name": self.name,
            **{s: c.model_dump() for s, c in sections.items()},
            **({"analysis": analysis} if analysis is not None else {}),
            SOURCES: {"module": describe_module(module), "data": sources},
            "pipeline": f"{BUILT_IN_PYTHON} {type(module).__name__}",
        }
        config_text = (
            "# a code-first run: torchloom.Trainer(...).fit(...); `loom process` builds it again "
            f"from `{SOURCES}`\n" + dump_config(record)
        )
        if point is not None:
            if point.checkpoint.get("config"):
                started = point.checkpoint["config"]
                check_resumed_config(started, config_text, _where(), "Trainer settings")
            has_validation = "validation" in sections
            finished = finished_result(point.run_dir, point.checkpoint, config, has_validation)
            if finished is not None:
                return finished
        return start_run(
            pipeline,
            sections,
            name=self.name,
            seed=seed,
            options=options,
            where=_where,
            config_text=config_text,
            resume=point,
        )

    def _analysis_section(self, declared: Mapping[str, outputs.Output]) -> dict[str, Any] | None:
        """The `analysis:` section this run stands for; its outputs default to the module's
        Classification outputs (a YAML pipeline's default is its `predictions` stream)."""
        value = self.analysis
        if value is False:
            return None
        if self.hook_factory is None and value not in (None, True):
            raise TypeError("this Trainer runs no analysis: use torchloom.Trainer")
        if value is None or value is True:
            section: dict[str, Any] = {}
        elif isinstance(value, str):
            section = {"preset": value}
        elif isinstance(value, Mapping):
            section = dict(value)
        else:
            message = f"must be a preset name, a mapping or False, got {type(value).__name__}"
            raise ConfigError.at(ANALYSIS, "analysis", message)
        section.setdefault(
            "outputs",
            [
                {"name": name, "predictions": name, "targets": out.target, "ids": INDICES}
                for name, out in declared.items()
                if isinstance(out, outputs.Classification)
            ],
        )
        return section


def _run_seed(point: ResumePoint) -> int | None:
    """The seed a resumed run started with (its config as started, else its config.yaml)."""
    text = point.checkpoint.get("config") or (point.run_dir / "config.yaml").read_text("utf-8")
    training = parse_config_text(text, str(point.run_dir / "config.yaml")).data.get("training")
    seed = training.get("seed") if isinstance(training, Mapping) else None
    return seed if isinstance(seed, int) else None
