"""`loom check CONFIG [overrides]`: build, handshake, and print the pipeline table."""

from __future__ import annotations

import argparse

from torchloom.analysis.build import check_analysis
from torchloom.cli.table import format_table
from torchloom.config.schema import TrainingConfig
from torchloom.core.component import Component
from torchloom.core.streams import StreamSpec
from torchloom.engine.assemble import Assembled, assemble
from torchloom.engine.loaders import check_on_device
from torchloom.engine.optim import checking_only
from torchloom.engine.training_parts import build_training_parts


def _streams(component: Component, specs: dict[str, StreamSpec]) -> str:
    renamed = component.pipeline_specs(specs)
    return ", ".join(f"{component.stream_name(k)} {s.shape_text()}" for k, s in renamed.items())


def pipeline_table(assembled: Assembled, shown_path: str) -> str:
    """The table `loom check` prints; `shown_path` is the config as the user named it."""
    pipeline = assembled.pipeline
    lines = [f"pipeline '{assembled.name}' ({shown_path})", ""]
    task_rows = [
        [f"{section}.task", type(task).__name__, _streams(task, task.output_specs())]
        for section, task in pipeline.tasks.items()
    ]
    if task_rows:
        lines.append(format_table(["section", "type", "outputs"], task_rows))
        lines.append("")
    rows = []
    for component in pipeline.components.values():
        trainable, frozen = component.parameter_counts()
        inputs = _streams(component, component.input_specs()) or "-"
        outputs = _streams(component, component.output_specs()) or "-"
        state = "frozen" if component.frozen else ("trainable" if trainable else "-")
        rows.append(
            [
                component.name,
                type(component).__name__,
                f"{inputs} -> {outputs}",
                f"{trainable + frozen:,}",
                state,
            ]
        )
    lines.append(
        format_table(
            ["component", "type", "inputs -> outputs", "params", "state"], rows, align_right={3}
        )
    )
    total_trainable = sum(c.parameter_counts()[0] for c in pipeline.components.values())
    total_frozen = sum(c.parameter_counts()[1] for c in pipeline.components.values())
    lines.append("")
    lines.append(f"parameters: {total_trainable:,} trainable, {total_frozen:,} frozen")
    shown = [
        f"{k}={v.value!r}"
        for k, v in pipeline.globals.items()
        if not isinstance(v.value, (dict, list)) or len(v.value) <= 4
    ]
    lines.append("globals: " + (", ".join(shown) or "none"))
    for name, component in [*pipeline.tasks.items(), *pipeline.components.items()]:
        lines += [f"note: {name}: {message}" for message in component.build_notes]
    sections = ", ".join(pipeline.tasks) or "no sections with a task"
    lines.append(f"handshake: ok ({sections})")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    assembled = assemble(args.config, args.overrides, args.disable)
    training = assembled.sections.get("training")
    lines = [pipeline_table(assembled, args.config)]
    if isinstance(training, TrainingConfig):  # what `loom train` would also reject
        with checking_only():
            build_training_parts(assembled.pipeline, training, assembled.config.where)
        check_on_device(assembled.pipeline.tasks, assembled.sections, assembled.config.where)
        _, skipped = check_analysis(
            assembled.config.data, assembled.pipeline, assembled.config.where
        )
        lines += [f"note: analysis: {', '.join(i)} skipped: {why}" for why, i in skipped.items()]
    if "search" in assembled.config.data:
        lines.append(_check_search(args))
    print("\n".join(lines))
    return 0


def _check_search(args: argparse.Namespace) -> str:
    """The `search:` section as `loom search` reads it: structure, paths, conditions,
    settings, and every range end and choice through this same build and handshake."""
    from torchloom.config import load_config
    from torchloom.search.checking import check_values, read_space
    from torchloom.search.settings import read_settings

    loaded = load_config(args.config, args.overrides)
    space = read_space(loaded, None)
    settings = read_settings(space, {})
    check_values(args.config, args.overrides, loaded, space)
    shown = ", ".join(f"{p.path} ({p.describe()})" for p in space.parameters.values())
    return f"search: ok, sampler {settings.sampler['type']}: {shown}"
