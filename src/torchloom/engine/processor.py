"""The processor worker: one pass over a section in eval mode (`loom process`).

Given a run folder it uses that run's config and checkpoint (best, last or a path) and writes
into a new subfolder of the run; given a config it creates a new run folder. Components that
export files (StreamFileExporter) write into the same subfolder.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchloom.config import LoadedConfig, dump_config, load_config
from torchloom.config.loading import ConfigSource
from torchloom.config.schema import validate_sections
from torchloom.core.pipeline import Pipeline
from torchloom.core.weights import load_pipeline_weights
from torchloom.data.atomic_files import refuse_links, write_text_atomic
from torchloom.engine.assemble import build_checked, pipeline_name, resolve_device
from torchloom.engine.checkpoint import load_checkpoint, seed_everything
from torchloom.engine.code_first_pipeline import BUILT_IN_PYTHON, rebuild_pipeline
from torchloom.engine.code_first_sources import KEY as CODE_FIRST
from torchloom.engine.evaluation import evaluate, statistics_copy
from torchloom.engine.loaders import SectionLoader
from torchloom.engine.run_folder import create_run_folder, started_by_another, write_artifacts
from torchloom.engine.state import evaluated_epoch
from torchloom.engine.step import Precision, WeightedLoss
from torchloom.errors import ConfigError, did_you_mean
from torchloom.statistics.csv_log import CsvLog


@dataclass
class ProcessResult:
    folder: Path
    statistics: dict[str, float]
    weights: dict[str, Any] | None = None  # what the checkpoint loaded (WeightsMatch.report)


def checkpoint_path(run_dir: Path | None, checkpoint: str | None) -> Path | None:
    if checkpoint in (None, "best", "last") and run_dir is not None:
        chosen = checkpoint or "best"
        path = run_dir / "checkpoints" / f"{chosen}.pt"
        if checkpoint is None and not path.exists():  # asked for best.pt by name: it or none
            path = run_dir / "checkpoints" / "last.pt"  # a run with no validation has no best
        return path
    if checkpoint in ("best", "last"):
        raise ConfigError.at(
            "command line",
            f"--checkpoint {checkpoint}",
            "needs a run folder, not a config",
            "give a checkpoint file path",
        )
    return Path(checkpoint).expanduser() if checkpoint else None


def process(
    source: ConfigSource,
    overrides: Sequence[str] = (),
    section: str = "test",
    checkpoint: str | None = None,
    expdir: str = "runs",
    device: str | None = None,
    disable: Sequence[str] = (),
    *,
    checkpoint_strict: bool = True,
    module: Any = None,
    data: Any = None,
    prebuilt: Pipeline | None = None,
) -> ProcessResult:
    """One eval pass. The checkpoint's weights must fit the pipeline: none matching is an
    error, and so is a partial match unless `checkpoint_strict` is False (then the pass's
    summary lists what was loaded and what was not). `module`/`data`: a code-first run's
    module and section data given in code, in place of those its config.yaml records (see
    engine/code_first_sources.py). `prebuilt`: the run folder's pipeline with its weights
    already in it (a `loom quantize` result, whose int8 models are no checkpoint)."""
    config: ConfigSource = source
    run_dir = None
    if not isinstance(source, Mapping):
        source = Path(source).expanduser()
        run_dir = source if source.is_dir() else None
        config = source / "config.yaml" if run_dir is not None else source
        another = started_by_another(run_dir) if run_dir is not None else None
        if another is not None and prebuilt is None:  # evaluated with weights left out
            raise ConfigError.at("", f"run folder '{run_dir}'", *another)
        if run_dir is not None:
            refuse_links(run_dir)  # process/ is written into it
    loaded = load_config(config, overrides)
    training = loaded.data.get("training") or {}
    if prebuilt is not None:
        seed_everything(int(training.get("seed") or 0))
        pipeline = prebuilt
    elif _is_code_first(loaded, module, data, disable):
        seed = int(training.get("seed") or 0)  # seeds the data as fit did, then the build
        record = loaded.data.get(CODE_FIRST)
        pipeline = rebuild_pipeline(record, section, seed, loaded.where, module, data)
    else:
        validate_sections(loaded.data, loaded.where, for_training=False)
        seed_everything(int(training.get("seed") or 0))
        pipeline = build_checked(loaded, disable)
    if section not in pipeline.tasks:
        raise ConfigError.at(
            loaded.where(),
            f"--section {section}",
            "the config has no task for this section",
            did_you_mean(section, pipeline.tasks)
            or f"sections: {', '.join(pipeline.tasks) or 'none'}",
        )
    weights = checkpoint_path(run_dir, checkpoint) if prebuilt is None else None
    loaded_weights, progress = None, None
    if weights is not None:
        state = load_checkpoint(weights)
        progress = state.get("progress")
        match = load_pipeline_weights(
            pipeline.components, state["components"], f"checkpoint '{weights}'", checkpoint_strict
        )
        loaded_weights = match.report()
    torch_device = resolve_device(device)
    pipeline.to(torch_device)
    # The run's autocast, so that its test split gives the figures of its own test pass; an
    # int8 pipeline (a `loom quantize` folder) runs in float32, and so does an fp16 run
    # processed off a GPU (fp16 autocast on a host is slow, and not the GPU's numbers anyway).
    precision = "fp32" if prebuilt is not None else training.get("precision") or "fp32"
    if precision == "fp16" and torch_device.type != "cuda":
        precision = "fp32"
    settings: Any = section_config(loaded.data, section, loaded.where)
    # The run's seed and the checkpoint's epoch: the data its own evaluation visited (a
    # k-fold run's held-out fold of that epoch, not fold 0, which it trained on).
    data_epoch = evaluated_epoch(progress)
    loader = SectionLoader(
        section,
        pipeline.tasks[section],
        settings,
        int(training.get("seed") or 0),
        loaded.where,
        pin_memory=torch_device.type == "cuda",
        device=torch_device,
    )
    if run_dir is not None:
        folder = create_run_folder(run_dir, "process", section)
    else:
        folder = create_run_folder(expdir, pipeline_name(loaded), f"process_{section}")
        header = "".join(f"# override: {o}\n" for o in overrides)
        named = {"name": pipeline_name(loaded), **loaded.data}  # the name, as `loom train`
        write_text_atomic(folder / "config.yaml", header + dump_config(named))
    write_artifacts(folder, pipeline.components)
    started = time.perf_counter()
    for component in pipeline.components.values():
        component.begin_pass(section, folder)
    try:
        loss = (
            WeightedLoss(pipeline, training.get("loss_weights") or {}, loaded.where)
            if (pipeline.losses)
            else None
        )
        pipeline.check_next_batch(section)
        values = evaluate(
            pipeline,
            loader.epoch(data_epoch),
            statistics_copy(pipeline, torch_device),
            loss,
            Precision(precision, torch_device),
            torch_device,
        )
    finally:
        for component in pipeline.components.values():
            component.end_pass()
    CsvLog(folder / f"{section}_statistics.csv").write(values)
    summary = {
        "section": section,
        "source": str(source) if not isinstance(source, Mapping) else str(loaded.path.name),
        "checkpoint": str(weights) if weights else None,
        "weights": loaded_weights,
        "precision": precision,
        "samples": values.get("samples"),
        "data_epoch": data_epoch,  # the epoch its sampler visited, from 0
        "wall_time_seconds": round(time.perf_counter() - started, 3),
        "statistics": values,
    }
    write_text_atomic(folder / f"{section}_summary.json", json.dumps(summary, indent=2) + "\n")
    return ProcessResult(folder, values, loaded_weights)


def section_config(data: dict[str, Any], section: str, where: Any) -> Any:
    from torchloom.config.schema import SectionConfig

    # A code-first run given a section's data in code may have no such section recorded.
    settings = data.get(section) or {"task": {"type": "python"}}
    return SectionConfig.model_validate(
        {k: v for k, v in settings.items() if k in SectionConfig.model_fields}
    )


def _is_code_first(loaded: LoadedConfig, module: Any, data: Any, disable: Sequence[str]) -> bool:
    """A run of `torchloom.Trainer(...).fit(...)` (its `pipeline` is a sentence, not
    components): rebuilt from its record or from the objects given in code."""
    pipeline = loaded.data.get("pipeline")
    code_first = CODE_FIRST in loaded.data or str(pipeline).startswith(BUILT_IN_PYTHON)
    if (module is not None or data is not None) and not code_first:
        message = "module= and data= are for runs of torchloom.Trainer(...).fit(...)"
        raise ConfigError.at(loaded.where(), "process(module=, data=)", message)
    if code_first and disable:
        message = "a code-first run has no pipeline components to disable"
        raise ConfigError.at("command line", "--disable", message)
    return code_first
