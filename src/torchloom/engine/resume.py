"""What `--resume` may and may not do: continue exactly the run that was started.

A resumed run uses the config it started with. Its text is kept in every checkpoint (and
`config.yaml` is written read-only): an edit of `config.yaml` is an error naming the changed
keys, and overrides given to `--resume` may change only the keys that do not change what the
steps compute (when to stop, how often to log and save). A run that already reached its
terminal condition is not run again: resuming it does nothing and says so, unless one of its
conditions was raised on purpose (a larger `epoch_limit`, say).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torchloom.config.dumping import MISSING, config_changes, dump_config, override_text
from torchloom.config.loading import LoadedConfig, load_config
from torchloom.config.overrides import parse_override
from torchloom.config.schema import TrainingConfig
from torchloom.config.yaml_reader import parse_config_text
from torchloom.data.atomic_files import write_text_atomic
from torchloom.engine.run_folder import RunResult, read_summary
from torchloom.engine.terminal import Status, converged, limit_reached
from torchloom.errors import ConfigError, Problem

# Keys an override to `--resume` may change: none of them changes what a step computes.
SAFE_RESUME_KEYS = (
    "training.terminal_conditions.epoch_limit",
    "training.terminal_conditions.episode_limit",
    "training.terminal_conditions.early_stopping.patience",
    "training.logging_interval",
    "training.checkpoint_interval",
)
CONFIG_FILE = "config.yaml"


def _shown(changes: Sequence[tuple[str, Any, Any]]) -> str:
    return ", ".join(f"{key} ({old!r} -> {new!r})" for key, old, new in changes)


def write_run_config(run_dir: Path, text: str) -> None:
    """config.yaml, read-only: it is the record of how the run was started (resume checks
    it), not a file to edit; `loom train RUN/config.yaml` starts a new run from it."""
    path = run_dir / CONFIG_FILE
    write_text_atomic(path, text)
    os.chmod(path, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)


def config_change_problem(run_dir: Path, started_text: str) -> Problem | None:
    """The problem with a config.yaml that differs from the config the checkpoint was saved
    with, naming the changed keys (comments and layout may change, and the keys a resume may
    change); None when it is the same. A deleted config.yaml is written back."""
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        write_run_config(run_dir, started_text)
        return None
    current_text = path.read_text(encoding="utf-8")
    if current_text == started_text:
        return None
    started = parse_config_text(started_text, f"{path} (as started)").data
    current = parse_config_text(current_text, str(path)).data
    # What a resume may change is no edit: config.yaml records a resume's overrides when the
    # resume starts, and a session that failed before its first save left them there.
    changes = _unsafe_changes(started, current)
    if not changes:
        return None
    return Problem(
        str(path),
        "config.yaml",
        f"differs from the config the checkpoint was saved with: {_shown(changes)} (was it "
        "edited, or does the checkpoint come from another run?); a resumed run continues "
        "exactly the run that was started",
        "undo the edit; pass an override to --resume for a key that may change "
        f"({', '.join(k.rsplit('.', 1)[-1] for k in SAFE_RESUME_KEYS)}); or start a new run "
        f"from the edited file: loom train {path}",
    )


def check_resumed_config(started_text: str, resumed_text: str, where: str, subject: str) -> None:
    """The config a run resumes with may differ from the one it started with in the
    SAFE_RESUME_KEYS only (also what they change through interpolation: a scheduler's
    `T_max: ${...epoch_limit}` is not safe). `subject`: what asked for the change (the
    overrides given to --resume, the settings of a code-first `fit`)."""
    started = parse_config_text(started_text, "the started config").data
    resumed = parse_config_text(resumed_text, "the resumed config").data
    unsafe = _unsafe_changes(started, resumed)
    if unsafe:
        raise ConfigError.at(
            where,
            subject,
            f"would change {_shown(unsafe)}, which changes what the resumed steps compute",
            f"a resumed run may change only {', '.join(SAFE_RESUME_KEYS)}; "
            "start a new run for anything else",
        )


def resumed_config(
    current_text: str,
    data: Mapping[str, Any],
    overrides: Sequence[str],
    disable: Sequence[str],
    episode: int,
    written: str | None,
) -> tuple[str, str | None]:
    """For a resume given overrides or `--disable`: config.yaml's new text (`data`, the
    resolved config with them, under the header of `current_text` and a record of each
    override), and the config as written with them; checked first, so that they change
    nothing but the SAFE_RESUME_KEYS, directly or through an interpolation."""
    recorded = "".join(f"# override on resume at episode {episode}: {o}\n" for o in overrides)
    text = config_header(current_text) + recorded + dump_config(data)
    given = [*overrides, *(f"--disable {name}" for name in disable)]
    subject = f"--resume {' '.join(given)}"
    check_resumed_config(current_text, text, "command line", subject)
    if written is not None:
        written = written_with_overrides(written, overrides, subject)
    return text, written


def written_with_overrides(written_text: str, overrides: Sequence[str], subject: str) -> str:
    """The run's config as written (`${...}` unresolved) with the overrides given to
    --resume, after checking what they change once it is resolved again: config.yaml holds
    resolved values, where a scheduler's `T_max: ${...epoch_limit}` is a plain number that
    raising epoch_limit would leave behind (the new epochs at the end of the schedule)."""
    written, before, after = _resolved_again(written_text, overrides)
    unsafe = _unsafe_changes(before.data, after.data)
    if unsafe:
        given = " ".join(overrides)
        also = " ".join(override_text(key, new) for key, _, new in unsafe)
        raise ConfigError.at(
            "command line",
            subject,
            f"would change {_shown(unsafe)} through an interpolation in the run's config, "
            "which changes what the resumed steps compute",
            f"start a new run from the config you started this one with (its ${{...}} "
            f"resolve again): loom train CONFIG {given}; config.yaml holds resolved values, "
            f"so a run from it needs those keys too: loom train RUN_DIR/config.yaml {given} "
            f"{also}",
        )
    # load_config names a mapping's pipeline when it sets none: not the run's written config.
    unresolved = {k: v for k, v in after.unresolved.items() if k != "name" or "name" in written}
    return dump_config(unresolved, interpolations=True)


def following_overrides(written_text: str, overrides: Sequence[str]) -> list[str]:
    """What `overrides` change in the run's config as written once it is resolved again,
    beyond the keys they set: each key that follows one of them through an interpolation (a
    scheduler's `T_max: ${training.terminal_conditions.epoch_limit}`), as an override of its
    new value, for a run started from config.yaml, which holds resolved values."""
    given = {parse_override(text).dotted_key: text for text in overrides}
    # Added where missing: the overrides are made for config.yaml, whose keys may differ.
    added = [f"++{key}={text.partition('=')[2]}" for key, text in given.items()]
    _, before, after = _resolved_again(written_text, added)
    return [
        override_text(key, new)
        for key, _, new in config_changes(before.data, after.data)
        if key not in given and new is not MISSING
    ]


def _resolved_again(
    written_text: str, overrides: Sequence[str]
) -> tuple[dict[str, Any], LoadedConfig, LoadedConfig]:
    """The run's config as written (its data), resolved without and with `overrides`."""
    written = parse_config_text(written_text, "the run's config as written").data
    return written, load_config(written), load_config(written, overrides)


def _unsafe_changes(
    started: Mapping[str, Any], resumed: Mapping[str, Any]
) -> list[tuple[str, Any, Any]]:
    """The changes from `started` to `resumed` that a resumed run may not make: any key but
    the SAFE_RESUME_KEYS, and the logging interval where it paces an online run's validation."""
    return [
        change
        for change in config_changes(started, resumed)
        if change[0] not in SAFE_RESUME_KEYS or _paces_validation(change[0], resumed)
    ]


def _paces_validation(key: str, config: Mapping[str, Any]) -> bool:
    """Whether `key` is the logging interval of an online run that validates at it (no
    `validation.partial_validation_interval`): then it sets how often the monitor and early
    stopping judge, and what their patience counts."""
    training, validation = config.get("training") or {}, config.get("validation") or {}
    return (
        key == "training.logging_interval"
        and training.get("mode") == "online"
        and validation.get("partial_validation_interval") is None
    )


def config_header(text: str) -> str:
    """The leading comment lines of a config text (its `# override:` record)."""
    lines = []
    for line in text.splitlines(keepends=True):
        if not line.startswith("#"):
            break
        lines.append(line)
    return "".join(lines)


def finished_result(
    run_dir: Path, checkpoint: Mapping[str, Any], training: TrainingConfig, has_validation: bool
) -> RunResult | None:
    """The run's result when it already reached its terminal condition and the config (with
    the overrides given to --resume) leaves nothing more to do; None when it should go on."""
    summary = read_summary(run_dir)
    try:
        status = Status(summary.get("status"))
    except ValueError:
        return None
    if not status.finished:
        return None  # interrupted, failed or killed: what --resume is for
    progress, conditions = checkpoint["progress"], training.terminal_conditions
    if status is Status.DIVERGED:
        done = True
    elif status.by_limit:
        done = limit_reached(conditions, progress["epoch"], progress["episode"]) is not None
    elif status is Status.EARLY_STOPPED:
        stopping = conditions.early_stopping
        patience = None if stopping is None else stopping.patience
        done = patience is not None and checkpoint["monitor"]["bad_evaluations"] > patience
    else:
        latest = checkpoint["running"]["latest"]
        statistics = {k: v for values in latest.values() for k, v in values.items()}
        done = converged(conditions, statistics, has_validation)
    return RunResult(run_dir, summary, already_finished=True) if done else None
