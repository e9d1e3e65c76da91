"""The Python API: the same workers as the `loom` command, as functions.

    import torchloom
    result = torchloom.train("configs/mnist/lenet5.yml", ["training.optimizer.lr=0.01"])
    result.run_dir, result.status, result.statistics["test"]["accuracy"]
    torchloom.process(result.run_dir, section="test").statistics

    trainer = torchloom.Trainer(epochs=3, analysis="full")    # a plain nn.Module, no YAML
    result = trainer.fit(Net(), train=my_data.train_set, validation=my_data.validation_set)

A config is a YAML path or a mapping (a pipeline described in Python), read as its YAML
would be (no file is written); a mapping's `default_configs` are relative to the working
directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Imported `as` themselves: also the seam of the training API for the tools built on it
# (torchloom.search), re-exported (see check_training below).
from torchloom.analysis.build import build_hooks
from torchloom.config.loading import ConfigSource
from torchloom.engine.architecture_search import searchable_components as searchable_components
from torchloom.engine.assemble import load_and_validate as load_and_validate
from torchloom.engine.assemble import pipeline_name as pipeline_name
from torchloom.engine.checkpoint import (
    reproducible_cublas_workspace as reproducible_cublas_workspace,
)
from torchloom.engine.code_first import CodeFirstTrainer
from torchloom.engine.processor import ProcessResult
from torchloom.engine.processor import process as _process
from torchloom.engine.run_folder import RunResult as RunResult
from torchloom.engine.run_folder import create_run_folder as create_run_folder
from torchloom.engine.run_folder import failure_reason as failure_reason
from torchloom.engine.setup import prepare_training as prepare_training
from torchloom.engine.state import Hook as Hook
from torchloom.engine.state import RunView as RunView
from torchloom.engine.state import TrainOptions as TrainOptions
from torchloom.errors import ConfigError


def train(
    config: ConfigSource | None = None,
    overrides: Sequence[str] | str = (),
    *,
    expdir: str = "runs",
    tag: str = "",
    device: str | None = None,
    quiet: bool = True,
    tensorboard: int = 1,
    disable: Sequence[str] = (),
    resume: str | os.PathLike[str] | None = None,
    analysis: bool = True,
) -> RunResult:
    """Train a pipeline (or continue the run folder `resume`); returns its run folder and
    summary. `analysis=False` skips the config's analysis section (reports, plots). Raises a
    `torchloom.errors.LoomError` subclass for anything the user can fix."""
    overrides = _override_list(overrides, "train")
    options = TrainOptions(
        expdir=expdir,
        tag=tag,
        device=device,
        quiet=quiet,
        tensorboard=tensorboard,
        disable=disable,
        hook_factory=build_hooks if analysis else None,
    )
    if resume is not None and config is not None:
        # The run continues with the config it started with: one given here would be
        # ignored, as if taken (the CLI refuses the same).
        raise ConfigError.at(
            "torchloom.train(...)",
            "train(config, resume=...)",
            "continues a run with the config it started with: give no config",
            "give train(resume=RUN_DIR, overrides=[...]) with overrides of the keys that "
            "may change on resume (epoch_limit, ...)",
        )
    if resume is not None:
        prepared = prepare_training(None, overrides, options, resume=Path(resume))
    elif config is None:
        raise TypeError("train() needs a config or resume=")
    else:
        prepared = prepare_training(config, overrides, options)
    if isinstance(prepared, RunResult):
        return prepared  # a resumed run that had already finished: nothing was done
    return prepared.run()


def _override_list(overrides: Sequence[str] | str, function: str) -> list[str]:
    """The overrides as a list: one string is one override (iterated, it was one override
    per character)."""
    if isinstance(overrides, str):
        return [overrides]
    if not all(isinstance(o, str) for o in overrides):
        raise ConfigError.at(
            f"torchloom.{function}(...)",
            f"{function}(overrides=...)",
            "must be a list of strings such as 'training.optimizer.lr=0.01'",
        )
    return list(overrides)


class Trainer(CodeFirstTrainer):
    __doc__ = CodeFirstTrainer.__doc__
    # The same hooks a YAML run's `analysis:` section gets (one path for both).
    hook_factory = staticmethod(build_hooks)


def process(
    source: ConfigSource,
    overrides: Sequence[str] | str = (),
    *,
    section: str = "test",
    checkpoint: str | None = None,
    expdir: str = "runs",
    device: str | None = None,
    disable: Sequence[str] = (),
    checkpoint_strict: bool = True,
    module: Any = None,
    data: Any = None,
) -> ProcessResult:
    """One eval pass over `section` of a run folder (its best weights by default) or config.
    `checkpoint_strict=False` loads the checkpoint's matching weights and lists the rest.

    For a run of `torchloom.Trainer(...).fit(...)`, `module` (an instance of the trained
    class) and `data` (the section's dataset, or a factory) replace what the run recorded, so
    any code-first run can be processed, rebuildable by `loom process` or not."""
    overrides = _override_list(overrides, "process")
    code = {"module": module, "data": data, "checkpoint_strict": checkpoint_strict}
    source = source if isinstance(source, Mapping) else Path(source)
    return _process(source, overrides, section, checkpoint, expdir, device, disable, **code)


def quantize(run_dir: str | os.PathLike[str], mode: str = "static", **options: Any) -> Any:
    """`loom quantize`: a run's model components as int8 (mode dynamic or static), measured
    against float, written to RUN_DIR/quantized/<mode>/. Options as the command's
    (backend=, calibration_batches=, per_channel=, skip=, checkpoint=, force=, repeats=);
    returns a QuantizeResult (folder, report). See torchloom/deploy/quantize.py."""
    from torchloom.deploy.quantize import quantize as run_quantize

    return run_quantize(Path(run_dir), mode, **options)


def export(run_dir: str | os.PathLike[str], format: str = "onnx", **options: Any) -> Any:
    """`loom export`: a run's tensor graph as ONNX (checked in ONNX Runtime), pt2 or
    safetensors, written to RUN_DIR/exports/<format>/. Options as the command's (outputs=,
    opset=, dynamic_batch=, checkpoint=, force=); returns an ExportResult (folder, report).
    See torchloom/deploy/export.py."""
    from torchloom.deploy.export import export as run_export

    return run_export(Path(run_dir), format, **options)


# ---- the training API's seam for tools built on it (torchloom.search) ----------------------
# What a tool that runs training runs may use, and all it uses of the engine (imported at the
# top of this module): a tool imports these names from here, never from torchloom.engine.*,
# so the engine may change inside.
#   prepare_training(config, overrides, options)   a run set up as `loom train` sets it up
#   TrainOptions, Hook, RunView, RunResult         its options, hooks, live view and result
#   failure_reason(error)                          one line for why a run failed
#   reproducible_cublas_workspace()                before a process's first training: a later
#                                                  deterministic one is reproducible on a GPU
#   load_and_validate(config), pipeline_name(...)  a config read and checked; its run name
#   create_run_folder(parent, name)                a dated run folder
#   check_training(config, overrides)              what `loom train` checks before any data
#   searchable_components(pipeline)                its components that search an architecture


def check_training(config: ConfigSource, overrides: Sequence[str] = ()) -> set[str]:
    """What `loom train` checks before it reads data: schema, build, handshake, optimizer,
    scheduler, loss weights and monitor (a LoomError when something is wrong). Returns the
    statistics the run would have (`training.loss`, `validation.accuracy`, ...)."""
    from torchloom.config.schema import TrainingConfig
    from torchloom.engine.assemble import assemble
    from torchloom.engine.evaluation import statistic_names
    from torchloom.engine.optim import checking_only
    from torchloom.engine.training_parts import build_training_parts

    assembled = assemble(config, overrides)
    training = assembled.sections.get("training")
    if not isinstance(training, TrainingConfig):
        raise ConfigError.at(
            assembled.config.where(), "section 'training'", "is required to train", ""
        )
    with checking_only():
        parts = build_training_parts(assembled.pipeline, training, assembled.config.where)
    pipeline = assembled.pipeline
    sections = ["training", *(["validation"] if "validation" in pipeline.tasks else [])]
    return set(statistic_names(pipeline, parts.loss, sections))
