"""A trained run folder's pipeline, rebuilt from its config.yaml with a checkpoint's weights:
what `loom quantize` and `loom export` start from. Nothing is written here."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torchloom.config import LoadedConfig, load_config
from torchloom.config.schema import validate_sections
from torchloom.core.pipeline import Pipeline
from torchloom.core.weights import load_pipeline_weights
from torchloom.data.atomic_files import refuse_links
from torchloom.engine.assemble import build_checked, pipeline_name
from torchloom.engine.checkpoint import load_checkpoint, seed_everything
from torchloom.engine.processor import checkpoint_path
from torchloom.engine.run_folder import started_by_another
from torchloom.engine.run_lock import run_liveness
from torchloom.errors import DeployError


@dataclass
class TrainedRun:
    run_dir: Path
    config: LoadedConfig
    pipeline: Pipeline
    checkpoint: Path
    # The run's config with its `${...}` unresolved, kept in checkpoints since 2026-11-28.
    config_written: str | None = None
    # Where the checkpoint's weights stand (epoch, episode, batch_in_epoch): a report says
    # which it was, and measures on the data its evaluation visited (state.evaluated_epoch).
    progress: dict[str, int] | None = None

    @property
    def name(self) -> str:
        return pipeline_name(self.config)


def load_trained_run(
    run_dir: str | Path, checkpoint: str | None = None, overrides: Sequence[str] = ()
) -> TrainedRun:
    """The run's pipeline in eval mode, on the CPU, with the weights of `checkpoint` (best,
    last or a path; the run's best.pt, else last.pt, by default)."""
    # Resolved: reports and a fine-tuning's record name it the same however it was spelled.
    folder = Path(run_dir).expanduser().resolve()
    config_file = folder / "config.yaml"
    if not folder.is_dir():
        raise DeployError.at("", f"run folder '{folder}'", "does not exist")
    if not config_file.is_file():
        raise DeployError.at(
            "",
            f"run folder '{folder}'",
            "has no config.yaml: it is not a run folder of `loom train`",
            "give the folder `loom train` printed (<expdir>/<pipeline>/<date>)",
        )
    refuse_links(folder)  # exports/ and quantized/ are written into it
    # Folders of other commands, which have no checkpoint ("train it first" said nothing).
    for marker, kind, use in (
        ("search.json", "a search folder of `loom search`", "give a trial's run folder (trials/)"),
        (
            "quantization_report.json",
            "a result of `loom quantize`",
            "loom process or loom predict it; export the run it was made from",
        ),
    ):
        if (folder / marker).is_file():
            raise DeployError.at("", f"folder '{folder}'", f"is {kind}, not a run folder", use)
    another = started_by_another(folder)  # a QAT fine-tuning: modules config.yaml lacks
    if another is not None:
        raise DeployError.at("", f"run folder '{folder}'", *another)
    own = checkpoint in (None, "best", "last")
    liveness = run_liveness(folder)
    if own and liveness.alive and liveness.pid != os.getpid():  # not a hook of the run
        raise DeployError.at(
            "",
            f"run folder '{folder}'",
            f"is still training ({liveness.reason}): its checkpoints change as it trains, and "
            "the result would not be the run's",
            "wait for it to end (loom runs shows it), or copy a checkpoint and give the copy "
            "with --checkpoint PATH",
        )
    weights = checkpoint_path(folder, checkpoint)
    if weights is None or not weights.is_file():
        raise DeployError.at(
            "",
            f"run folder '{folder}'",
            f"has no checkpoint {weights.name if weights else ''} to deploy"
            + (f" ({weights})" if weights else ""),
            "train it first, or name a checkpoint file with --checkpoint PATH",
        )
    loaded = load_config(config_file, overrides)
    if "pipeline" in loaded.data and not isinstance(loaded.data["pipeline"], dict):
        raise DeployError.at(
            str(config_file),
            "pipeline",
            "is a run of torchloom.Trainer(...).fit (a Python module, not components)",
            "export the module yourself with torch.onnx.export",
        )
    validate_sections(loaded.data, loaded.where, for_training=False)
    seed_everything(int((loaded.data.get("training") or {}).get("seed") or 0))
    pipeline = build_checked(loaded)
    state = load_checkpoint(weights)
    load_pipeline_weights(pipeline.components, state["components"], f"checkpoint '{weights}'")
    pipeline.eval()
    progress = state.get("progress")
    progress = progress if isinstance(progress, dict) else {}
    kept = ("epoch", "episode", "batch_in_epoch")
    at = {k: v for k, v in progress.items() if k in kept and isinstance(v, int)}
    return TrainedRun(folder, loaded, pipeline, weights, state.get("config_written"), at or None)
