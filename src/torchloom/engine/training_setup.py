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
from torchloom.engine.assemble import build_checked, load_and_validate, pipeline_name
from torchloom.engine.checkpoint import load_checkpoint
from torchloom.engine.compilation import compile_models
from torchloom.engine.devices import resolve_device
from torchloom.engine.divergence import DivergenceGuard
from torchloom.engine.evaluation import statistics_copy
from torchloom.engine.hooks import Hooks
from torchloom.engine.loaders import SectionLoader
from torchloom.engine.precision import Precision
from torchloom.engine.reporting import Reporter, log_build_notes, make_logger
from torchloom.engine.run_folder import create_run_folder, write_artifacts, write_text_atomic
from torchloom.engine.run_state import RunState, TrainOptions
from torchloom.engine.seeding import seed_everything, set_deterministic
from torchloom.engine.signals import StopSignals
from torchloom.engine.training_parts import build_training_parts
from torchloom.errors import ConfigError, Problem
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
) -> RunState:
    """A run from a YAML config (new) or from a run folder (`resume`)."""
    checkpoint = None
    if resume is not None:
        if overrides or config is not None:
            raise ConfigError(
                [
                    Problem(
                        "command line",
                        "--resume",
                        "continues a run exactly as it was configured: give no config or overrides",
                    )
                ]
            )
        checkpoint = load_checkpoint(Path(resume).expanduser() / "checkpoints" / "last.pt")
        config = Path(resume).expanduser() / "config.yaml"
    assert config is not None
    loaded, sections = load_and_validate(config, overrides)
    training = _training_section(loaded, sections)
    seed = training.seed if training.seed is not None else secrets.randbelow(2**31)
    loaded.data["training"]["seed"] = seed  # recorded, so config.yaml reproduces the run
    seed_everything(seed)
    set_deterministic(training.deterministic)
    pipeline = build_checked(loaded, options.disable)
    if options.disable:  # recorded, so the saved config reproduces the run as it ran
        pipeline_cfg = loaded.data.setdefault("pipeline", {})
        pipeline_cfg["disable"] = [*(pipeline_cfg.get("disable") or []), *options.disable]
    header = "".join(f"# override: {o}\n" for o in overrides)
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
        header + dump_config(loaded.data),
        checkpoint,
        Path(resume).expanduser() if resume is not None else None,
    )


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
) -> RunState:
    """Set up a run of a built pipeline (from YAML or from Python). Everything that can fail
    is checked before the run folder is created; config_text is saved as its config.yaml."""
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
    else:
        run_dir = create_run_folder(options.expdir, name, options.tag)
        write_text_atomic(run_dir / "config.yaml", config_text)
        write_artifacts(run_dir, pipeline.components)
    log = make_logger(run_dir, options.quiet)
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
        ),
        log=log,
        monitor=parts.monitor,
        signals=StopSignals(),
        show_progress=not options.quiet,
        train_statistics=statistics_copy(pipeline, device),
        validation_statistics=statistics_copy(pipeline, device),
        hooks=Hooks(options.hooks),
        compiled_models=compiled,
    )
    if checkpoint is not None:
        state.restore(checkpoint)
        log.info("resumed from episode %d (epoch %d)", state.progress.episode, state.progress.epoch)
    return state
