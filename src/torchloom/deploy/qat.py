"""Quantization-aware training for `loom quantize --mode qat`: the run's models, fused and
fake-quantized (`Quantizer.prepare` of the QAT route), fine-tuned from the run's checkpoint
as a real training run of the engine (`start_run`: a run folder with its statistics, logs and
checkpoints, validation and early stopping as the run's config says), then given back with
the weights of that run's best checkpoint, ready for `convert`.

The fine-tuning run lives in `RUN_DIR/quantized/qat_training/<name>/<date>/`. Its learning
rate is the run's own times `QAT_RATE_FACTOR` unless given: fake quantization moves weights by
at most half a quantization step, and the full rate undoes the float training's last epochs.
It cannot be continued with `loom train --resume` (its checkpoints hold fake-quantized
modules, which a pipeline built from config.yaml does not have); a new `loom quantize --mode
qat --force` starts again from the float checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from torchloom.config import dump_config
from torchloom.core.weights import load_pipeline_weights
from torchloom.deploy.run_model import TrainedRun
from torchloom.engine.assemble import load_and_validate, pipeline_name
from torchloom.engine.checkpoint import load_checkpoint
from torchloom.engine.setup import start_run
from torchloom.engine.state import TrainOptions
from torchloom.errors import DeployError

QAT_RATE_FACTOR = 0.1


def fine_tune(run: TrainedRun, epochs: int, learning_rate: float | None = None) -> Path:
    """Train the (already QAT-prepared) pipeline of `run` for `epochs` epochs; returns the
    training run's folder. The pipeline ends with the weights of its best checkpoint."""
    training = run.config.data.get("training") or {}
    rate = learning_rate
    if rate is None:
        given = (training.get("optimizer") or {}).get("lr")
        if not isinstance(given, (int, float)):
            raise DeployError.at(
                "command line",
                "--qat-lr",
                "the run's config gives no training.optimizer.lr to start from",
                "give the fine-tuning rate with --qat-lr",
            )
        rate = float(given) * QAT_RATE_FACTOR
    overrides = [
        f"training.terminal_conditions.epoch_limit={epochs}",
        f"training.optimizer.lr={rate}",
    ]
    loaded, sections = load_and_validate(run.run_dir / "config.yaml", overrides)
    header = f"# quantization-aware fine-tuning of {run.run_dir} ({run.checkpoint.name})\n"
    header += "".join(f"# override: {o}\n" for o in overrides)
    options = TrainOptions(
        expdir=str(run.run_dir / "quantized" / "qat_training"),
        device="cpu",
        quiet=True,
        tensorboard=0,
    )
    loop = start_run(
        run.pipeline,
        sections,
        name=pipeline_name(loaded),
        seed=int(loaded.data["training"].get("seed") or 0),
        options=options,
        where=loaded.where,
        config_text=header + dump_config(loaded.data),
    )
    result = loop.run()
    folder = Path(result.run_dir)
    status = str(result.summary.get("status", ""))
    if status in ("diverged", "failed", "interrupted"):
        raise DeployError.at(
            "",
            f"quantization-aware fine-tuning in '{folder}'",
            f"ended {status}: {result.summary.get('reason', '')}",
            "lower the rate with --qat-lr",
        )
    best = folder / "checkpoints" / "best.pt"
    state = load_checkpoint(best if best.is_file() else folder / "checkpoints" / "last.pt")
    load_pipeline_weights(run.pipeline.components, state["components"], f"'{folder}'")
    run.pipeline.eval()
    return folder
