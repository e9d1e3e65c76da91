"""Setting up a training run: from a config (a new run) or a run folder (resume) to a
`TrainingLoop` ready to run.

Every check that can fail happens before anything is written: a rejected config, a missing
data set or a checkpoint that does not fit leaves no trace. Order matters for exact resume:
seed, build the pipeline (weight init draws from the seeded RNG), set up loaders and
optimizer, and only then restore a checkpoint's states -- RNG last (TrainingLoop), so
nothing drawn during set-up shifts the run. What resume may change is engine/resume.py's.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from torchloom.config import dump_config
from torchloom.config.loading import ConfigSource
from torchloom.config.schema import TrainingConfig, ValidationConfig
from torchloom.core.pipeline import Pipeline
from torchloom.core.weights import match_pipeline_weights
from torchloom.data.samplers import check_split_sizes
from torchloom.engine.architecture_search import build_search, with_search_split
from torchloom.engine.assemble import (
    build_checked,
    load_and_validate,
    pipeline_name,
    resolve_device,
)
from torchloom.engine.checkpoint import load_resume_checkpoint, seed_everything, set_deterministic
from torchloom.engine.distributed import (
    check_shardable,
    check_strategy_hooks,
    current,
    process_device,
    wrap_models,
)
from torchloom.engine.loaders import SectionLoader
from torchloom.engine.optim import build_optimizer, build_scheduler
from torchloom.engine.reporting import Reporter, close_logger, log_build_notes, make_logger
from torchloom.engine.resume import (
    config_change_problem,
    finished_result,
    resumed_config,
    write_run_config,
)
from torchloom.engine.run_folder import (
    RunResult,
    create_run_folder,
    read_started_by,
    started_by_reason,
    write_artifacts,
)
from torchloom.engine.run_lock import NoLock, RunLock, in_use, run_liveness
from torchloom.engine.state import Hooks, RunSetup, TrainOptions
from torchloom.engine.step import DivergenceGuard, Precision, compile_models
from torchloom.engine.trainer import TrainingLoop
from torchloom.engine.training_parts import build_training_parts
from torchloom.errors import ConfigError, Problem, StorageError, WeightsError, Where
from torchloom.host_memory import VARIABLE as THP_VARIABLE
from torchloom.host_memory import huge_page_tensors_in_effect


# ---- from a config ---------------------------------------------------------------------------
@dataclass
class ResumePoint:
    """A run folder to continue: its last checkpoint (`note` says so when last.pt was damaged
    and last.prev.pt was read instead) and the folder's lock, already held."""

    run_dir: Path
    checkpoint: dict[str, Any]
    lock: RunLock | NoLock
    note: str | None = None


def open_resume_point(run_dir: Path, shown: str) -> ResumePoint:
    """Lock a run folder (before reading what a running process may write) and read its
    checkpoint; `shown` is how the user named it (`--resume X`, `fit(resume=X)`)."""
    if not (run_dir / "checkpoints").is_dir():
        # A run whose trainer has not saved yet is in use, not a folder that is no run.
        if run_dir.is_dir() and run_liveness(run_dir).alive:
            raise in_use(run_dir, ": it has saved no checkpoint yet")
        why = "(it does not exist)" if not run_dir.exists() else "(no checkpoints/)"
        raise ConfigError.at(
            "command line",
            shown,
            f"is not a run folder with checkpoints {why}",
            "give <expdir>/<pipeline>/<date> of a run that saved last.pt",
        )
    lock = RunLock(run_dir).acquire() if current().main else NoLock()
    try:
        checkpoint, note = load_resume_checkpoint(run_dir / "checkpoints", current().main)
    except BaseException:
        lock.release()
        raise
    return ResumePoint(run_dir, checkpoint, lock, note)


def prepare_training(
    config: ConfigSource | None,
    overrides: Sequence[str],
    options: TrainOptions,
    resume: str | Path | None = None,
) -> TrainingLoop | RunResult:
    """A run from a config (a YAML file or a mapping: a new run) or from a run folder
    (`resume`, with overrides of the keys that may change on resume only). Resuming a run
    that already reached its terminal condition returns its RunResult (`already_finished`):
    there is nothing to do."""
    if resume is None:
        if config is None:
            raise ConfigError.at("command line", "config", "give a config file or --resume")
        return _prepare(config, overrides, options)
    if config is not None:
        raise ConfigError.at(
            "command line",
            "--resume",
            "continues a run with the config it started with: give no config file",
            "overrides of the keys that may change on resume are allowed",
        )
    folder = Path(resume).expanduser()
    started_by = read_started_by(folder)
    if started_by is not None:
        raise ConfigError.at(
            "command line",
            f"--resume {resume}",
            started_by_reason(started_by, "its config.yaml alone does not rebuild its pipeline"),
            f"continue it with `{started_by.get('command') or 'the command that started it'}`",
        )
    point = open_resume_point(folder, f"--resume {resume}")
    try:
        prepared = _prepare(point.run_dir / "config.yaml", overrides, options, point)
    except BaseException:
        point.lock.release()
        raise
    if isinstance(prepared, RunResult):
        point.lock.release()
    return prepared


def _prepare(
    config: ConfigSource,
    overrides: Sequence[str],
    options: TrainOptions,
    resume: ResumePoint | None = None,
) -> TrainingLoop | RunResult:
    started_text = changed = None
    if resume is not None:
        started_text = resume.checkpoint.get("config")
        # Compared before config.yaml is read: an edit is an error naming the changed keys.
        changed = config_change_problem(resume.run_dir, started_text) if started_text else None
    loaded, sections = load_and_validate(config, overrides)
    training = sections.get("training")
    if not isinstance(training, TrainingConfig):
        raise ConfigError.at(
            loaded.where(), "section 'training'", "is required to train", "add a training section"
        )
    seed = training.seed if training.seed is not None else secrets.randbelow(2**31)
    seed_everything(seed)
    set_deterministic(training.deterministic)
    pipeline = build_checked(loaded, options.disable)
    # Recorded in config.yaml and the config as written, so that both reproduce the run.
    for data in (loaded.data, loaded.unresolved):
        data["training"]["seed"] = seed
        if options.disable:
            pipeline_cfg = data.setdefault("pipeline", {})
            pipeline_cfg["disable"] = [*(pipeline_cfg.get("disable") or []), *options.disable]
    config_text = "".join(f"# override: {o}\n" for o in overrides) + dump_config(loaded.data)
    config_written: str | None = dump_config(loaded.unresolved, interpolations=True)
    if resume is not None:  # the run's own (None in a checkpoint from before it was kept)
        config_written = resume.checkpoint.get("config_written")
        _check_checkpoint_fits(pipeline, resume, changed)
        current_text = (resume.run_dir / "config.yaml").read_text(encoding="utf-8")
        if overrides or options.disable:  # --disable changes the pipeline: checked alike
            at = resume.checkpoint["progress"]["episode"]
            config_text, config_written = resumed_config(
                current_text, loaded.data, overrides, options.disable, at, config_written
            )
        else:
            config_text = started_text or current_text  # exactly as it started
        finished = finished_result(
            resume.run_dir, resume.checkpoint, training, "validation" in sections
        )
        if finished is not None:
            return finished
    if options.hook_factory is not None:
        extra = options.hook_factory(loaded.data, pipeline, loaded.where)
        options = replace(options, hooks=[*options.hooks, *extra])
    return start_run(
        pipeline,
        sections,
        name=pipeline_name(loaded),
        seed=seed,
        options=options,
        where=loaded.where,
        config_text=config_text,
        resume=resume,
        config_written=config_written,
    )


def _check_checkpoint_fits(
    pipeline: Pipeline, resume: ResumePoint, changed: Problem | None
) -> None:
    """Before anything is written: the checkpoint's weights fit the pipeline (shape errors
    name the weight), and config.yaml is the config the checkpoint was saved with."""
    source = f"checkpoint of {resume.run_dir}"
    try:
        match_pipeline_weights(pipeline.components, resume.checkpoint["components"], source)
    except WeightsError as error:
        raise WeightsError([*error.problems, *([changed] if changed else [])]) from None
    if changed is not None:
        raise ConfigError([changed])


# ---- from a built pipeline -------------------------------------------------------------------
def start_run(
    pipeline: Pipeline,
    sections: Mapping[str, BaseModel],
    *,
    name: str,
    seed: int,
    options: TrainOptions,
    where: Where,
    config_text: str,
    resume: ResumePoint | None = None,
    config_written: str | None = None,
) -> TrainingLoop:
    """The loop of a run of a built pipeline (from YAML or from Python), new or resumed.
    Everything that can fail is checked before the run folder is created; `config_text` is
    saved as its config.yaml (`config_written`, its `${...}` unresolved, in checkpoints). If
    set-up fails, what it opened is closed: the folder's lock, the run's log (whose handlers
    also sit on the shared loggers, where a search's next trial would write into this run's
    run.log) and the training data's workers."""
    with ExitStack() as undo:
        if resume is not None:
            undo.callback(resume.lock.release)
        setup = _setup(pipeline, sections, name, seed, options, where, config_text, resume, undo)
        setup.config_written = config_written
        loop = TrainingLoop(setup, resume.checkpoint if resume is not None else None)
        undo.pop_all()  # the loop's from here: it closes them when the run ends
        return loop


def _section_loader(
    section: str,
    pipeline: Pipeline,
    sections: Mapping[str, BaseModel],
    seed: int,
    where: Where,
    device: torch.device,
) -> SectionLoader | None:
    if section not in pipeline.tasks:
        return None
    config: Any = sections[section]
    dist = current()
    return SectionLoader(
        section,
        pipeline.tasks[section],
        config,
        seed,
        where,
        pin_memory=device.type == "cuda",
        rank=dist.rank,
        world=dist.world,
        reservoir=section == "training",
        device=device,
    )


def _setup(
    pipeline: Pipeline,
    sections: Mapping[str, BaseModel],
    name: str,
    seed: int,
    options: TrainOptions,
    where: Where,
    config_text: str,
    resume: ResumePoint | None,
    undo: ExitStack,
) -> RunSetup:
    """A run's parts; what it opens is registered on `undo`, to close if set-up fails."""
    training = sections["training"]
    assert isinstance(training, TrainingConfig)
    dist = current()
    device = process_device(resolve_device(options.device), dist)
    pipeline.to(device)
    parts = build_training_parts(pipeline, training, where)  # config checks before any data
    sections = with_search_split(sections)  # the weights' part, when searching an architecture
    loaders = {
        s: _section_loader(s, pipeline, sections, seed, where, device)
        for s in ("training", "validation", "test")
    }
    held = {s: loader for s, loader in loaders.items() if loader is not None}
    samplers = {s: getattr(sections[s], "sampler", None) for s in held}
    check_split_sizes({s: len(loader.task) for s, loader in held.items()}, samplers, where)
    train_data = loaders["training"]
    assert train_data is not None, "a training run has a training task"
    undo.callback(train_data.close)
    if dist.active:
        check_shardable(loaders, pipeline, dist, where, training.distributed.strategy)
        check_strategy_hooks(options.hooks, training.distributed.strategy, dist, where)
    # Everything is checked: only now is anything written (by rank 0 alone, of several).
    lock: RunLock | NoLock = NoLock()
    if resume is not None:
        run_dir, lock = resume.run_dir, resume.lock
        if dist.main and config_text != resume.checkpoint.get("config", config_text):
            write_run_config(run_dir, config_text)  # overrides given to --resume
    elif dist.main:
        run_dir = create_run_folder(options.expdir, name, options.tag)
        lock = RunLock(run_dir).acquire()
        undo.callback(lock.release)
        try:
            write_run_config(run_dir, config_text)
            write_artifacts(run_dir, pipeline.components)
        except OSError as error:
            raise StorageError.from_os(error.filename or run_dir, error) from error
        dist.broadcast(str(run_dir))
    else:
        run_dir = Path(dist.broadcast(None))
    log = make_logger(run_dir, options.quiet, writing=dist.main)
    undo.callback(close_logger, log)
    if resume is not None and resume.note is not None:
        log.warning("%s", resume.note)
    log_build_notes(log, pipeline)
    if device.type == "cpu":
        huge_pages = huge_page_tensors_in_effect()
        log.info(
            "CPU tensors of 2 MiB or more on huge pages: %s",
            "yes"
            if huge_pages
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
    optimizer, scheduler = parts.optimizer, parts.scheduler
    strategy = training.distributed.strategy
    if dist.active:
        wrapped = wrap_models(pipeline, device, strategy)
        kind = "FSDP2 fully_shard" if strategy == "fsdp" else "DistributedDataParallel"
        log.info("%d processes train (%s: %s)", dist.world, kind, ", ".join(wrapped))
        if strategy == "fsdp":  # the parameters are DTensors now: the optimizer must see them
            optimizer = build_optimizer(training.optimizer.model_dump(), pipeline, where)
            scheduler = build_scheduler(
                training.scheduler.model_dump() if training.scheduler else None, optimizer, where
            )
    validation = sections.get("validation")
    running = resume.checkpoint if resume is not None else None
    precision = Precision(training.precision, device)
    search = build_search(
        pipeline, training, parts.loss, precision, optimizer, seed, where, dist.active
    )
    return RunSetup(
        name=name,
        config=training,
        validation_config=validation if isinstance(validation, ValidationConfig) else None,
        run_dir=run_dir,
        config_text=config_text,
        device=device,
        seed=seed,
        pipeline=pipeline,
        train_data=train_data,
        validation_data=loaders["validation"],
        test_data=loaders["test"],
        optimizer=optimizer,
        scheduler=scheduler,
        precision=precision,
        loss=parts.loss,
        guard=DivergenceGuard(device, parts.loss.streams),
        monitor=parts.monitor,
        reporter=Reporter(
            run_dir,
            log,
            options.tensorboard,
            running["progress"]["episode"] if running else None,
            running["running"].get("csv_rows") if running else None,
            writing=dist.main,
        ),
        log=log,
        lock=lock,
        # Analysis is rank 0's, but for the hooks that merge every process's share.
        hooks=Hooks(options.hooks if dist.main else [h for h in options.hooks if h.every_rank]),
        compiled_models=compiled,
        show_progress=not options.quiet and dist.main,
        distributed=dist,
        architecture_search=search,
    )
