"""Setting up a training run from a config (new run) or a run folder (resume).

Every check that can fail happens before the run folder is created, so a rejected config or a
missing data set leaves nothing behind. Order matters for exact resume: seed, build the
pipeline (weight init draws from the seeded RNG), set up loaders and optimizer, and only then
restore a checkpoint's states — RNG last, so nothing drawn during set-up shifts the run.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from torchloom.config import LoadedConfig, dump_config
from torchloom.config.schema import TrainingConfig, ValidationConfig
from torchloom.core.pipeline import Pipeline
from torchloom.core.weights import match_pipeline_weights
from torchloom.engine.assemble import build_checked, load_and_validate, pipeline_name
from torchloom.engine.checkpoint import load_resume_checkpoint
from torchloom.engine.compilation import compile_models
from torchloom.engine.devices import resolve_device
from torchloom.engine.divergence import DivergenceGuard
from torchloom.engine.evaluation import statistics_copy
from torchloom.engine.hooks import Hooks
from torchloom.engine.loaders import SectionLoader
from torchloom.engine.precision import Precision
from torchloom.engine.reporting import Reporter, log_build_notes, make_logger
from torchloom.engine.resume import (
    check_resumed_config,
    config_change_problem,
    config_header,
    finished_result,
    write_run_config,
)
from torchloom.engine.run_folder import RunLock, create_run_folder, write_artifacts
from torchloom.engine.run_state import RunState, TrainOptions
from torchloom.engine.seeding import seed_everything, set_deterministic
from torchloom.engine.signals import StopSignals
from torchloom.engine.summary import RunResult
from torchloom.engine.training_parts import build_training_parts
from torchloom.errors import ConfigError, Problem, StorageError, WeightsError
from torchloom.host_memory import VARIABLE as THP_VARIABLE
from torchloom.host_memory import huge_page_tensors_in_effect


def _section_loader(
    section: str,
    pipeline: Pipeline,
    sections: Mapping[str, BaseModel],
    seed: int,
    where: Callable[..., str],
    device: torch.device,
) -> SectionLoader | None:
    if section not in pipeline.tasks:
        return None
    config: Any = sections[section]
    return SectionLoader(
        section, pipeline.tasks[section], config, seed, where, pin_memory=device.type == "cuda"
    )


def _training_section(loaded: LoadedConfig, sections: Mapping[str, BaseModel]) -> TrainingConfig:
    training = sections.get("training")
    if not isinstance(training, TrainingConfig):
        raise ConfigError(
            [
                Problem(
                    loaded.where(),
                    "section 'training'",
                    "is required to train",
                    "add a training section with a task",
                )
            ]
        )
    return training


def _clipping(training: TrainingConfig) -> tuple[float | None, float | None, float]:
    clip = training.gradient_clipping
    if clip is None:
        return None, None, 2.0
    return clip.norm, clip.value, clip.norm_type


def prepare_training(
    config: str | Path | None,
    overrides: Sequence[str],
    options: TrainOptions,
    resume: str | Path | None = None,
) -> RunState | RunResult:
    """A run from a YAML config (new) or from a run folder (`resume`, with overrides of the
    keys that may change on resume only). Resuming a run that already reached its terminal
    condition returns its RunResult (`already_finished`): there is nothing to do."""
    if resume is None:
        if config is None:
            raise ConfigError([Problem("command line", "config", "give a config file or --resume")])
        return _prepare(config, overrides, options)
    if config is not None:
        raise ConfigError(
            [
                Problem(
                    "command line",
                    "--resume",
                    "continues a run with the config it started with: give no config file",
                    "overrides of the keys that may change on resume are allowed",
                )
            ]
        )
    run_dir = Path(resume).expanduser()
    if not (run_dir / "checkpoints").is_dir():
        raise ConfigError(
            [
                Problem(
                    "command line",
                    f"--resume {resume}",
                    "is not a run folder with checkpoints "
                    + ("(it does not exist)" if not run_dir.exists() else "(no checkpoints/)"),
                    "give <expdir>/<pipeline>/<date> of a run that saved last.pt",
                )
            ]
        )
    lock = RunLock(run_dir).acquire()  # before reading anything a running process may write
    try:
        checkpoint, fallback = load_resume_checkpoint(run_dir / "checkpoints")
        started_text = checkpoint.get("config")
        changed = None if started_text is None else config_change_problem(run_dir, started_text)
        resumed = _prepare(
            run_dir / "config.yaml", overrides, options, checkpoint, lock, fallback, changed
        )
    except BaseException:
        lock.release()
        raise
    if isinstance(resumed, RunResult):
        lock.release()
    return resumed


def _prepare(
    config: str | Path,
    overrides: Sequence[str],
    options: TrainOptions,
    checkpoint: dict[str, Any] | None = None,
    lock: RunLock | None = None,
    fallback: str | None = None,
    config_changed: Problem | None = None,
) -> RunState | RunResult:
    loaded, sections = load_and_validate(config, overrides)
    training = _training_section(loaded, sections)
    header = "".join(f"# override: {o}\n" for o in overrides)
    if checkpoint is not None:
        run_dir = Path(config).parent
        started_text = (run_dir / "config.yaml").read_text(encoding="utf-8")
        if overrides:
            at = checkpoint["progress"]["episode"]
            header = config_header(started_text) + "".join(
                f"# override on resume at episode {at}: {o}\n" for o in overrides
            )
        else:
            header = config_header(started_text)
    seed = training.seed if training.seed is not None else secrets.randbelow(2**31)
    loaded.data["training"]["seed"] = seed  # recorded, so config.yaml reproduces the run
    seed_everything(seed)
    set_deterministic(training.deterministic)
    pipeline = build_checked(loaded, options.disable)
    if options.disable:  # recorded, so the saved config reproduces the run as it ran
        pipeline_cfg = loaded.data.setdefault("pipeline", {})
        pipeline_cfg["disable"] = [*(pipeline_cfg.get("disable") or []), *options.disable]
    config_text = header + dump_config(loaded.data)
    if checkpoint is not None:
        run_dir = Path(config).parent
        _check_checkpoint_fits(pipeline, checkpoint, run_dir, config_changed)
        if overrides:
            subject = f"--resume {' '.join(overrides)}"
            check_resumed_config(started_text, config_text, "command line", subject)
        else:
            config_text = checkpoint.get("config") or started_text  # exactly as it started
        finished = finished_result(run_dir, checkpoint, training, "validation" in sections)
        if finished is not None:
            return finished
    if options.hook_factory is not None:
        extra = options.hook_factory(loaded.data, pipeline, loaded.where)
        options = replace(options, hooks=[*options.hooks, *extra])
    return build_run_state(
        pipeline,
        sections,
        pipeline_name(loaded),
        seed,
        options,
        loaded.where,
        config_text,
        checkpoint,
        Path(config).parent if checkpoint is not None else None,
        lock,
        fallback,
    )


def _check_checkpoint_fits(
    pipeline: Pipeline, checkpoint: dict[str, Any], run_dir: Path, changed: Problem | None
) -> None:
    """Before anything is written: the checkpoint's weights fit the pipeline (shape errors
    name the weight), and config.yaml is the config the checkpoint was saved with."""
    source = f"checkpoint of {run_dir}"
    try:
        match_pipeline_weights(pipeline.components, checkpoint["components"], source)
    except WeightsError as error:
        raise WeightsError([*error.problems, *([changed] if changed else [])]) from None
    if changed is not None:
        raise ConfigError([changed])


def build_run_state(
    pipeline: Pipeline,
    sections: Mapping[str, BaseModel],
    name: str,
    seed: int,
    options: TrainOptions,
    where: Callable[..., str],
    config_text: str,
    checkpoint: dict[str, Any] | None = None,
    resume_dir: Path | None = None,
    lock: RunLock | None = None,
    fallback: str | None = None,
) -> RunState:
    """Set up a run of a built pipeline (from YAML or from Python). Everything that can fail
    is checked before the run folder is created; config_text is saved as its config.yaml.
    The run folder's lock (taken here for a new run) is released if set-up fails."""
    try:
        return _build_run_state(
            pipeline,
            sections,
            name,
            seed,
            options,
            where,
            config_text,
            checkpoint,
            resume_dir,
            lock,
            fallback,
        )
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _build_run_state(
    pipeline: Pipeline,
    sections: Mapping[str, BaseModel],
    name: str,
    seed: int,
    options: TrainOptions,
    where: Callable[..., str],
    config_text: str,
    checkpoint: dict[str, Any] | None,
    resume_dir: Path | None,
    lock: RunLock | None,
    fallback: str | None,
) -> RunState:
    training = sections["training"]
    assert isinstance(training, TrainingConfig)
    device = resolve_device(options.device)
    pipeline.to(device)
    parts = build_training_parts(pipeline, training, where)  # config checks before any data
    loaders = {
        s: _section_loader(s, pipeline, sections, seed, where, device)
        for s in ("training", "validation", "test")
    }
    train_data = loaders["training"]
    assert train_data is not None, "a training run has a training task"
    # Everything is checked: only now is anything written.
    if resume_dir is not None:
        run_dir = resume_dir
        lock = lock or RunLock(run_dir).acquire()
        if checkpoint is not None and config_text != checkpoint.get("config", config_text):
            write_run_config(run_dir, config_text)  # overrides given to --resume
    else:
        run_dir = create_run_folder(options.expdir, name, options.tag)
        lock = RunLock(run_dir).acquire()
        try:
            write_run_config(run_dir, config_text)
            write_artifacts(run_dir, pipeline.components)
        except OSError as error:
            raise StorageError.from_os(error.filename or run_dir, error) from error
    assert lock is not None
    log = make_logger(run_dir, options.quiet)
    if fallback is not None:
        log.warning("%s", fallback)
    log_build_notes(log, pipeline)
    if device.type == "cpu":
        log.info(
            "CPU tensors of 2 MiB or more on huge pages: %s",
            "yes"
            if huge_page_tensors_in_effect()
            else f"no (set {THP_VARIABLE}=1 before torch is imported, as the loom command does)",
        )
    compiled: list[str] = []
    if parts.compile_options is not None:
        compiled = compile_models(pipeline, parts.compile_options)
        log.info(
            "torch.compile %s: %s",
            parts.compile_options or "(defaults)",
            ", ".join(compiled) or "no model with weights",
        )
    validation = sections.get("validation")
    state = RunState(
        name=name,
        config=training,
        run_dir=run_dir,
        device=device,
        seed=seed,
        pipeline=pipeline,
        train_data=train_data,
        validation_data=loaders["validation"],
        validation_config=validation if isinstance(validation, ValidationConfig) else None,
        test_data=loaders["test"],
        optimizer=parts.optimizer,
        scheduler=parts.scheduler,
        precision=Precision(training.precision, device, *_clipping(training)),
        loss=parts.loss,
        guard=DivergenceGuard(device, parts.loss.streams),
        reporter=Reporter(
            run_dir,
            log,
            options.tensorboard,
            checkpoint["progress"]["episode"] if checkpoint else None,
            checkpoint["running"].get("csv_rows") if checkpoint else None,
        ),
        log=log,
        monitor=parts.monitor,
        signals=StopSignals(),
        show_progress=not options.quiet,
        train_statistics=statistics_copy(pipeline, device),
        validation_statistics=statistics_copy(pipeline, device),
        interval_statistics=statistics_copy(pipeline, device),
        lock=lock,
        config_text=config_text,
        hooks=Hooks(options.hooks),
        compiled_models=compiled,
    )
    if checkpoint is not None:
        state.restore(checkpoint, f"checkpoint of {run_dir}")
        log.info("resumed from episode %d (epoch %d)", state.progress.episode, state.progress.epoch)
    return state
