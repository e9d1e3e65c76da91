"""Quantization-aware training for `loom quantize --mode qat`: the run's models, fused and
fake-quantized (`Quantizer.prepare` of the QAT route), fine-tuned from the run's checkpoint
as a real training run of the engine (`start_run`: a run folder with its statistics, logs and
checkpoints, validation and early stopping as the run's config says), then given back with
the weights of that run's best checkpoint, ready for `convert`.

The fine-tuning run lives in `RUN_DIR/quantized/qat_training/<name>/<date>/`. Its learning
rate is the run's own times `QAT_RATE_FACTOR` unless given: fake quantization moves weights by
at most half a quantization step, and the full rate undoes the float training's last epochs.
A component's own rate (`optimizer.param_groups`) is scaled alike, keeping its ratio to the
run's rate.
It is seeded with the run's seed, so two fine-tunings of the same checkpoint with the same
options train alike.

Resume: the run folder's `started_by.json` (engine/run_folder.py) records what the
fine-tuning was started with (the float run and checkpoint, the quantization options, epochs
and rate) and the command that continues it. A fine-tuning stopped by Ctrl-C or SIGTERM
(last.pt saved), or killed (last.pt as the run's `training.checkpoint_interval` last saved
it), is continued by the same `loom quantize` command with `--resume`: the pipeline is
rebuilt and prepared as before, the checkpoint's fake-quantize states fitted and loaded, and
the engine's exact resume goes on from there (a run that had already finished is not trained
again: its best checkpoint is converted). `loom train --resume` refuses such a folder, naming
that command: its checkpoints hold fake-quantized modules that config.yaml does not build.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchloom.config import dump_config
from torchloom.config.schema import TrainingConfig
from torchloom.core.weights import load_pipeline_weights
from torchloom.deploy.quantizer import Quantizer
from torchloom.deploy.run_model import TrainedRun
from torchloom.engine.assemble import load_and_validate, pipeline_name
from torchloom.engine.checkpoint import load_checkpoint, seed_everything, set_deterministic
from torchloom.engine.resume import config_change_problem, finished_result, following_overrides
from torchloom.engine.run_folder import Status, read_started_by, read_summary, write_started_by
from torchloom.engine.setup import open_resume_point, start_run
from torchloom.engine.state import TrainOptions
from torchloom.engine.trainer import TrainingLoop
from torchloom.errors import ConfigError, DeployError

QAT_RATE_FACTOR = 0.1
RECORD_FORMAT = "torchloom-qat-fine-tuning"
TRAINING_FOLDER = ("quantized", "qat_training")
# What a resumed fine-tuning must be given as it was started (the report's names).
RECORDED = ("checkpoint", "options", "epochs", "qat_lr")


class FineTuningInterrupted(DeployError):
    """The fine-tuning run stopped at a signal; last.pt holds where it was (`loom quantize`
    exits 130 with the command that continues it)."""

    headline = "interrupted"


def training_root(run_dir: Path) -> Path:
    return run_dir.joinpath(*TRAINING_FOLDER)


def start_record(
    run: TrainedRun, quantizer: Quantizer, epochs: int, learning_rate: float | None
) -> dict[str, Any]:
    """What a fine-tuning is started with (its started_by.json), and what continuing one
    must give again."""
    return {
        "format": RECORD_FORMAT,
        "source_run": str(run.run_dir),
        "checkpoint": str(run.checkpoint),
        "options": quantizer.options.record(),
        "epochs": epochs,
        "qat_lr": learning_rate,
    }


def resumable(run: TrainedRun, record: dict[str, Any], resume: bool | str | Path) -> Path:
    """The fine-tuning run folder `--resume` continues (True: the run's latest; else that
    folder), checked before anything is measured: one of `loom quantize`, with a checkpoint,
    started with what `record` says."""
    given = None if isinstance(resume, bool) else Path(resume).expanduser()
    folder = _resumable(run, given)
    _check_same_start(folder, record)
    return folder


def fine_tune(
    run: TrainedRun,
    quantizer: Quantizer,
    epochs: int,
    learning_rate: float | None = None,
    resume_from: Path | None = None,
) -> Path:
    """Train the (already QAT-prepared) pipeline of `run` for `epochs` epochs, in a new
    fine-tuning run or in `resume_from` (see `resumable`). Returns the training run's folder;
    the pipeline ends with the weights of its best checkpoint."""
    record = start_record(run, quantizer, epochs, learning_rate)
    if resume_from is not None:
        folder: Path = resume_from
        loop = _resumed_loop(run, quantizer, folder)
    else:
        loop = _new_loop(run, record, epochs, learning_rate)
    if loop is not None:
        folder = loop.setup.run_dir
        result = loop.run()
        status = str(result.summary.get("status", ""))
        if status == "interrupted":
            raise FineTuningInterrupted.at(
                "",
                f"quantization-aware fine-tuning in '{folder}'",
                "stopped by a signal; last.pt holds where it was",
                f"continue it with `{resume_command(record)}`",
            )
        if status in ("diverged", "failed"):
            raise DeployError.at(
                "",
                f"quantization-aware fine-tuning in '{folder}'",
                f"ended {status}: {result.summary.get('reason', '')}",
                "lower the rate with --qat-lr (and add --force)",
            )
    best = folder / "checkpoints" / "best.pt"
    state = load_checkpoint(best if best.is_file() else folder / "checkpoints" / "last.pt")
    for model in run.pipeline.models:
        quantizer.fit_state(model, state["components"].get(model.name) or {})
    load_pipeline_weights(run.pipeline.components, state["components"], f"'{folder}'")
    run.pipeline.eval()
    return folder


def fine_tuning_record(folder: Path, epochs_asked: int) -> dict[str, Any]:
    """What the report says of a fine-tuning: what it trained, from its summary (the run's
    own stopping conditions, which it keeps, may end it before the epochs asked)."""
    summary = read_summary(folder)
    return {
        "epochs": summary.get("epochs"),
        "episodes": summary.get("episodes"),
        "status": summary.get("status"),
        "epochs_asked": epochs_asked,
        "training_run": str(folder),
    }


def resume_command(record: dict[str, Any]) -> str:
    """The `loom quantize` command that continues the fine-tuning `record` describes: the
    options it was started with (those that differ from the defaults), and `--resume`."""
    options = record["options"]
    words = ["loom", "quantize", record["source_run"], "--mode", "qat"]
    if options["backend"] != "x86":
        words += ["--backend", options["backend"]]
    if not options["per_channel"]:
        words.append("--per-tensor")
    if options["skip"]:
        words += ["--skip", ",".join(options["skip"])]
    checkpoint = Path(record["checkpoint"])
    if checkpoint != Path(record["source_run"]) / "checkpoints" / "best.pt":
        words += ["--checkpoint", str(checkpoint)]
    if record["epochs"] != 1:
        words += ["--qat-epochs", str(record["epochs"])]
    if record["qat_lr"] is not None:
        words += ["--qat-lr", repr(record["qat_lr"])]
    return shlex.join([*words, "--resume"])


def unfinished_fine_tuning(run_dir: str | Path) -> Path | None:
    """The latest fine-tuning run of `run_dir` that stopped before its end with a checkpoint
    to continue from (what `--resume` would pick), or None."""
    folders = _fine_tuning_runs(Path(run_dir).expanduser())
    if not folders:
        return None
    latest = folders[-1]
    done = read_summary(latest).get("status") in {s.value for s in Status if s.finished}
    return None if done or not (latest / "checkpoints" / "last.pt").is_file() else latest


# ---- a new fine-tuning run ---------------------------------------------------------------------
def _new_loop(
    run: TrainedRun, record: dict[str, Any], epochs: int, learning_rate: float | None
) -> TrainingLoop:
    optimizer = (run.config.data.get("training") or {}).get("optimizer") or {}
    given = optimizer.get("lr")
    base = float(given) if isinstance(given, (int, float)) and given > 0 else None
    if learning_rate is not None:
        rate = learning_rate
    elif base is not None:
        rate = base * QAT_RATE_FACTOR
    else:
        raise DeployError.at(
            "command line",
            "--qat-lr",
            "the run's config gives no training.optimizer.lr to start from",
            "give the fine-tuning rate with --qat-lr",
        )
    # A component's own rate (optimizer.param_groups) keeps its ratio to the base rate.
    groups = [
        f"training.optimizer.param_groups.{name}.lr={float(group['lr']) * rate / base}"
        for name, group in (optimizer.get("param_groups") or {}).items()
        if isinstance(group, Mapping) and isinstance(group.get("lr"), (int, float)) and base
    ]
    overrides = [
        f"training.terminal_conditions.epoch_limit={epochs}",
        f"training.optimizer.lr={rate}",
        *groups,
        # On the CPU, in float32: fake quantization takes float32 alone (a bf16 or fp16 run's
        # autocast hands it other dtypes), and a GPU run's compile would need a C++ compiler.
        "++training.precision=fp32",
        "++training.compile=false",
    ]
    if run.config_written is not None:
        # config.yaml holds resolved values: a cosine's `T_max: ${...epoch_limit}` would keep
        # the run's epochs, a schedule the fine-tuning's epochs would end early or restart.
        overrides += following_overrides(run.config_written, overrides)
    loaded, sections = load_and_validate(run.run_dir / "config.yaml", overrides)
    header = f"# quantization-aware fine-tuning of {run.run_dir} ({run.checkpoint.name})\n"
    header += "".join(f"# override: {o}\n" for o in overrides)
    seed = int(loaded.data["training"].get("seed") or 0)
    seed_everything(seed)  # what the fine-tuning draws (dropout) is the same every time
    loop = start_run(
        run.pipeline,
        sections,
        name=pipeline_name(loaded),
        seed=seed,
        options=_train_options(training_root(run.run_dir)),
        where=loaded.where,
        config_text=header + dump_config(loaded.data),
    )
    try:
        write_started_by(
            loop.setup.run_dir,
            {
                **record,
                "learning_rate": rate,
                "by": "loom quantize --mode qat",
                "command": resume_command(record),
                "reason": "its checkpoints hold fake-quantized modules, which its config.yaml "
                "does not build",
            },
        )
    except BaseException:
        loop.close()
        raise
    return loop


def _train_options(expdir: Path) -> TrainOptions:
    return TrainOptions(expdir=str(expdir), device="cpu", quiet=True, tensorboard=0)


# ---- resuming one ------------------------------------------------------------------------------
def _fine_tuning_runs(run_dir: Path) -> list[Path]:
    """The fine-tuning runs of `run_dir`, oldest first (run folders are named by date)."""
    root = training_root(run_dir)
    found = [
        folder
        for folder in root.glob("*/*")
        if (read_started_by(folder) or {}).get("format") == RECORD_FORMAT
    ]
    return sorted(found, key=lambda folder: (folder.name, str(folder)))


def _resumable(run: TrainedRun, given: Path | None) -> Path:
    """The fine-tuning run folder to continue: `given`, else the latest of the run's."""
    if given is None:
        folders = _fine_tuning_runs(run.run_dir)
        if not folders:
            raise DeployError.at(
                "command line",
                "--resume",
                f"'{training_root(run.run_dir)}' holds no quantization-aware fine-tuning run "
                "to continue",
                "start one without --resume",
            )
        folder = folders[-1]
    else:
        folder = given
        if (read_started_by(folder) or {}).get("format") != RECORD_FORMAT:
            raise DeployError.at(
                "command line",
                f"--resume {given}",
                "is not a quantization-aware fine-tuning run of `loom quantize` (it has no "
                "started_by.json of one)",
                f"give a folder under '{training_root(run.run_dir)}', or --resume alone",
            )
    if not (folder / "checkpoints" / "last.pt").is_file():
        raise DeployError.at(
            "command line",
            f"--resume {folder}",
            "holds no checkpoint yet: it stopped before its first save",
            "start anew without --resume (training.checkpoint_interval in the run's config "
            "saves mid-epoch)",
        )
    return folder


def _check_same_start(folder: Path, record: dict[str, Any]) -> None:
    """The command continuing a fine-tuning gives what it was started with."""
    started = read_started_by(folder) or {}
    differing = [key for key in RECORDED if started.get(key) != record[key]]
    if differing:
        shown = ", ".join(f"{key} {started.get(key)!r} (now {record[key]!r})" for key in differing)
        raise DeployError.at(
            "command line",
            f"--resume {folder}",
            f"was started with other options: {shown}",
            f"continue it with `{started.get('command') or resume_command({**record, **started})}`"
            ", or start anew without --resume",
        )


def _resumed_loop(run: TrainedRun, quantizer: Quantizer, folder: Path) -> TrainingLoop | None:
    """The engine's loop continuing `folder`, or None when that run already reached its end.
    The same checks as `loom train --resume`: config.yaml unchanged since the checkpoint, the
    checkpoint's weights fitting the (prepared) pipeline."""
    point = open_resume_point(folder, f"--resume {folder}")
    try:
        started_text = point.checkpoint.get("config")
        changed = config_change_problem(folder, started_text) if started_text else None
        if changed is not None:
            raise ConfigError([changed])
        loaded, sections = load_and_validate(folder / "config.yaml")
        training = sections["training"]
        assert isinstance(training, TrainingConfig)
        for model in run.pipeline.models:
            quantizer.fit_state(model, point.checkpoint["components"].get(model.name) or {})
        if finished_result(folder, point.checkpoint, training, "validation" in sections):
            point.lock.release()
            return None
        set_deterministic(training.deterministic)
        return start_run(
            run.pipeline,
            sections,
            name=pipeline_name(loaded),
            seed=int(training.seed or 0),
            options=_train_options(folder.parent.parent),
            where=loaded.where,
            config_text=started_text or (folder / "config.yaml").read_text(encoding="utf-8"),
            resume=point,
        )
    except BaseException:
        point.lock.release()
        raise
