"""The learning-rate range test (`loom lr-find`), Smith's ("Cyclical Learning Rates for
Training Neural Networks", 2015): train from the config's initial weights while the rate grows
exponentially from `start_lr` to `end_lr` over `steps` optimizer steps, stop where the raw loss
diverges, and suggest the rate where the loss falls fastest before that (`lr_range_rules`
holds both rules). It builds the pipeline, optimizer and training loader exactly as `loom
train` does, in a run folder of its own (`<expdir>/<name>/<stamp>_lr_find/`): it never touches
another run.

    result = lr_find("configs/mnist/lenet5.yml", steps=100)
    result.suggested_lr, result.run_dir  # lr_find.csv, lr_find.png, lr_find.json
"""

from __future__ import annotations

import json
import math
import os
import secrets
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from torchloom.analysis.lr_range_rules import (
    Divergence,
    DivergenceWatch,
    centred_average,
    smoothing_window,
    suggest,
)
from torchloom.analysis.plotting import CURVE_MARGINS, figure, save_png
from torchloom.config import dump_config
from torchloom.config.schema import GradientClippingConfig, TrainingConfig
from torchloom.core.component import Batch
from torchloom.data.atomic_files import write_text_atomic
from torchloom.engine.assemble import (
    build_checked,
    load_and_validate,
    pipeline_name,
    resolve_device,
)
from torchloom.engine.checkpoint import seed_everything, set_deterministic
from torchloom.engine.loaders import SectionLoader, to_device
from torchloom.engine.run_folder import as_user_error, create_run_folder
from torchloom.engine.step import Precision, WeightedLoss, clip_gradients, compile_models
from torchloom.engine.training_parts import build_training_parts
from torchloom.errors import ConfigError, Problem
from torchloom.statistics.csv_log import CsvLog

if TYPE_CHECKING:
    pass


# ---- the range test --------------------------------------------------------------------------
@dataclass
class LrFindResult:
    run_dir: Path
    suggested_lr: float
    rule: str  # how the suggestion was chosen, in words
    learning_rates: list[float]
    losses: list[float]  # raw: the mean loss of each step's batches
    smoothed_losses: list[float | None]  # the rule's centred average; None from divergence on
    divergence: Divergence | None
    stopped: str  # why the ramp ended


def _check_range(start_lr: float, end_lr: float, steps: int) -> None:
    problems = []
    if not 0 < start_lr < math.inf:
        problems.append(
            Problem("command line", "--start-lr", f"must be > 0 and finite, got {start_lr}")
        )
    if not start_lr < end_lr < math.inf:
        problems.append(
            Problem(
                "command line", "--end-lr", f"must be finite and above --start-lr, got {end_lr}"
            )
        )
    # The suggestion needs three steps whose centred window lies whole inside the ramp.
    needed = smoothing_window(steps) + 2
    if steps < needed:
        problems.append(
            Problem(
                "command line",
                "--steps",
                f"must be at least {needed} (a smoothing window of {needed - 2} and three "
                f"steps to compare), got {steps}",
            )
        )
    if problems:
        raise ConfigError(problems)


def lr_find(
    config_path: str | os.PathLike[str],
    overrides: Sequence[str] = (),
    start_lr: float = 1e-7,
    end_lr: float = 10.0,
    steps: int = 100,
    expdir: str | os.PathLike[str] = "runs",
    device: str | None = None,
    disable: Sequence[str] = (),
) -> LrFindResult:
    """Run the range test on the config's training section; see the module docstring.
    Raises ConfigError (a LoomError) for anything the user can fix."""
    _check_range(start_lr, end_lr, steps)
    loaded, sections = load_and_validate(config_path, overrides)
    training = sections.get("training")
    if not isinstance(training, TrainingConfig):
        problem = Problem(loaded.where(), "section 'training'", "is required to find a rate")
        raise ConfigError([problem])
    seed = training.seed if training.seed is not None else secrets.randbelow(2**31)
    loaded.data["training"]["seed"] = seed
    seed_everything(seed)
    set_deterministic(training.deterministic)
    pipeline = build_checked(loaded, disable)
    run_device = resolve_device(device)
    pipeline.to(run_device)
    parts = build_training_parts(pipeline, training, loaded.where)
    # Compiled as `loom train` compiles them: the ramp measures the steps the run will take.
    options = parts.compile_options
    compiled = compile_models(pipeline, options) if options is not None else []
    data = SectionLoader(
        "training",
        pipeline.tasks["training"],
        training,
        seed,
        loaded.where,
        pin_memory=run_device.type == "cuda",
        device=run_device,
    )
    precision = Precision(training.precision, run_device)
    clipping = training.gradient_clipping
    run_dir = create_run_folder(expdir, pipeline_name(loaded), "lr_find")
    write_text_atomic(run_dir / "config.yaml", dump_config(loaded.data))

    optimizer = parts.optimizer
    # Groups keep their configured ratios (a smaller rate for a pretrained encoder, say):
    # the ramp scales them all, and the first group's with a rate is the one reported.
    bases = [float(g.get("initial_lr", g["lr"])) for g in optimizer.param_groups]
    ratios = _ramp_ratios(bases)
    parameters = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    rates: list[float] = []
    watch = DivergenceWatch()
    stopped = f"all {steps} steps"
    batches = _endless(data, training.gradient_accumulation)
    pipeline.train()
    try:
        for step in range(steps):
            rate = start_lr * (end_lr / start_lr) ** (step / (steps - 1))
            for group, ratio in zip(optimizer.param_groups, ratios, strict=True):
                group["lr"] = rate * ratio
            loss = _optimizer_step(
                pipeline, parts.loss, precision, clipping, optimizer, parameters, batches
            )
            rates.append(rate)
            # Nothing after divergence can be suggested: the network is dead, or going.
            if watch.add(loss) is not None:
                stopped = f"the raw loss diverged (confirmed at step {step + 1})"
                break
    except Exception as raised:  # a user error as `loom train` gives it (a deterministic
        error = as_user_error(raised, run_dir)  # mode the pipeline cannot keep, a full disk)
        if error is raised:
            raise
        raise error from raised
    finally:
        batches.close()  # ends the last loader iteration (and its workers) now

    losses, divergence = watch.losses, watch.divergence
    window = smoothing_window(steps)
    end = divergence.began if divergence is not None else len(losses)
    smoothed: list[float | None] = [*centred_average(losses[:end], window)]
    smoothed += [None] * (len(losses) - end)
    suggestion = suggest(rates, losses, window, divergence)
    result = LrFindResult(
        run_dir,
        suggestion.rate if suggestion.rate is not None else math.nan,
        suggestion.rule,
        rates,
        losses,
        smoothed,
        divergence,
        stopped,
    )
    _write_files(result, start_lr, end_lr, steps, seed, run_device, compiled)
    if suggestion.rate is None:
        raise ConfigError([_no_suggestion(result, suggestion.problem)])
    return result


def _no_suggestion(result: LrFindResult, problem: str) -> Problem:
    """Why no rate is suggested, and which option to change."""
    low, high = result.learning_rates[0], result.learning_rates[-1]
    files = f"the curve is in {result.run_dir}"
    if result.divergence is not None:
        began = result.divergence.began
        rate = result.learning_rates[began]
        message = f"the raw loss diverged at step {began + 1} (rate {rate:.3g}); {problem}"
        return Problem(
            "command line",
            "--start-lr",
            message,
            f"start lower than {low:.3g}, or use more --steps; {files}",
        )
    return Problem(
        "command line",
        "--end-lr",
        f"{problem} (rates {low:.3g} to {high:.3g})",
        f"ramp higher than {high:.3g}, or use more --steps; {files}",
    )


def _ramp_ratios(bases: Sequence[float]) -> list[float]:
    """Each group's rate as a multiple of the ramp's: its configured ratio to the first group
    that has a rate (a group at rate 0, a frozen part, stays at 0); all 1 where none has."""
    reference = next((base for base in bases if base > 0), None)
    if reference is None:
        return [1.0] * len(bases)
    return [base / reference for base in bases]


def _endless(data: SectionLoader, accumulation: int) -> Generator[list[Batch], None, None]:
    """Groups of `accumulation` batches, epoch after epoch, for as many steps as asked."""
    epoch = 0
    while True:
        group: list[Batch] = []
        for batch in data.epoch(epoch):
            group.append(batch)
            if len(group) == accumulation:
                yield group
                group = []
        if group:
            yield group
        epoch += 1


def _optimizer_step(
    pipeline: torch.nn.Module,
    weighted_loss: WeightedLoss,
    precision: Precision,
    clipping: GradientClippingConfig | None,
    optimizer: torch.optim.Optimizer,
    parameters: list[torch.nn.Parameter],
    batches: Iterator[list[Batch]],
) -> float:
    """One optimizer step (over `accumulation` batches, as training makes it, in the order of
    TrainingLoop.train_step / optimizer_step); its mean loss."""
    group = next(batches)
    total = 0.0
    scaler = precision.scaler
    for batch in group:
        batch = to_device(batch, precision.device)
        with precision.autocast():
            pipeline(batch)
            loss = weighted_loss(batch)
        scaler.scale(loss / len(group) if len(group) > 1 else loss).backward()
        total += float(loss.detach())  # the test needs every loss on the host: one sync a batch
    scaler.unscale_(optimizer)
    clip_gradients(parameters, clipping)
    precision.step(optimizer)
    optimizer.zero_grad(set_to_none=True)
    return total / len(group)


def _write_files(
    result: LrFindResult,
    start_lr: float,
    end_lr: float,
    steps: int,
    seed: int,
    device: torch.device,
    compiled: list[str],
) -> None:
    run_dir, divergence = result.run_dir, result.divergence
    began = divergence.began if divergence is not None else len(result.losses)
    table = CsvLog(run_dir / "lr_find.csv")
    for step, (rate, loss, value) in enumerate(
        zip(result.learning_rates, result.losses, result.smoothed_losses, strict=True)
    ):
        row = {"step": step + 1, "lr": rate, "loss": loss, "smoothed_loss": value}
        table.write({**row, "diverged": int(step >= began)})
    suggested = result.suggested_lr if math.isfinite(result.suggested_lr) else None
    summary = {
        "suggested_lr": suggested,
        "rule": result.rule + (", before the raw loss diverged" if divergence else ""),
        "divergence": None
        if divergence is None
        else {
            "began_step": divergence.began + 1,
            "lr": result.learning_rates[divergence.began],
            "confirmed_step": divergence.detected + 1,
            "reason": divergence.reason,
        },
        "start_lr": start_lr,
        "end_lr": end_lr,
        "steps": steps,
        "steps_run": len(result.learning_rates),
        "stopped": result.stopped,
        "seed": seed,
        "device": str(device),
        "compiled": compiled,  # the models torch.compile compiled (`training.compile`)
    }
    write_text_atomic(run_dir / "lr_find.json", json.dumps(summary, indent=2) + "\n")
    _plot(result, run_dir / "lr_find.png", suggested, began)


def _plot(result: LrFindResult, path: Path, suggested: float | None, began: int) -> None:
    rates, losses = result.learning_rates, result.losses
    fig = figure(6.4, 4.4, CURVE_MARGINS)
    ax = fig.add_subplot()
    ax.plot(rates, losses, color="lightgrey", label="loss (one step's batches)")
    kept = [(r, v) for r, v in zip(rates, result.smoothed_losses, strict=True) if v is not None]
    if kept:
        ax.plot(*zip(*kept, strict=True), label="centred average")
    if suggested is not None:
        ax.axvline(suggested, color="red", linestyle="--", label=f"suggested {suggested:.3g}")
    divergence_lr = None
    if result.divergence is not None:
        divergence_lr = rates[began]
        ax.axvline(divergence_lr, color="black", linestyle=":", label="divergence began")
        ax.annotate(
            f"diverged from {divergence_lr:.3g}",
            (divergence_lr, 0.97),
            xycoords=("data", "axes fraction"),
            ha="right",
            va="top",
            rotation=90,
            fontsize=8,
        )
    before = [v for v in losses[: max(began, 1)] if math.isfinite(v)]
    if before:  # scaled to the curve before divergence: a spike to 44 would flatten it
        low = min(v for v in losses if math.isfinite(v))
        high = max(before)
        margin = 0.05 * (high - low) + 1e-12
        top = high + margin + (0.2 * (high - low) if result.divergence is not None else 0.0)
        ax.set_ylim(low - margin, top)
    ax.set_xscale("log")
    ax.set(xlabel="learning rate", ylabel="loss", title="learning-rate range test")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_png(fig, path, {"suggested_lr": suggested, "divergence_lr": divergence_lr})
