"""Building a pipeline from a config: tasks per section, then components, ordered by globals.

Steps, each collecting every problem before it raises:
1. parse every entry (type, renames, params) — `component_entry`;
2. order construction so every global is published before it is read (independent of the
   order of declaration), and build;
3. apply `freeze:` and `load:`;
4. order execution by stream dependencies — `ordering`.
The handshake (`handshake.py`) then checks the built graph.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torchloom.core.component import BuildContext, Component, Task
from torchloom.core.component_entry import ComponentEntry, Where, parse_entry
from torchloom.core.file_names import file_name_problem
from torchloom.core.globals_store import GlobalsStore
from torchloom.core.ordering import execution_order, topological_order
from torchloom.core.pipeline import Pipeline
from torchloom.core.weights import load_weights
from torchloom.errors import (
    ComponentError,
    DataError,
    LoomError,
    Problem,
    did_you_mean,
    first_line,
)
from torchloom.host_memory import out_of_host_memory

SECTIONS = ("training", "validation", "test")
PIPELINE_SETTINGS = ("disable", "freeze")


def _names_list(value: Any, key: str, where: str) -> tuple[list[str], list[Problem]]:
    """`disable`/`freeze` accept a list of names or a comma-separated string."""
    if value is None or value is False:
        return [], []
    if isinstance(value, str):
        return [n.strip() for n in value.split(",") if n.strip()], []
    if isinstance(value, Sequence) and all(isinstance(n, str) for n in value):
        return list(value), []
    return [], [
        Problem(where, f"pipeline.{key}", f"expected a list of component names, got {value!r}")
    ]


def _parse_entries(
    config: Mapping[str, Any],
    where: Where,
    disable: Sequence[str],
    unusable: set[str],
) -> tuple[list[ComponentEntry], list[str], list[Problem]]:
    problems: list[Problem] = []
    entries: list[ComponentEntry] = []
    pipeline_cfg = config.get("pipeline") or {}
    if not isinstance(pipeline_cfg, Mapping):
        return (
            [],
            [],
            [
                Problem(
                    where("pipeline"),
                    "pipeline",
                    "must be a mapping of component names to their configs",
                )
            ],
        )
    component_names = [n for n in pipeline_cfg if n not in PIPELINE_SETTINGS]
    disabled, found = _names_list(
        pipeline_cfg.get("disable"), "disable", where("pipeline", "disable")
    )
    problems += found
    for name in [*disabled, *disable]:
        if name not in component_names:
            problems.append(
                Problem(
                    where("pipeline", "disable"),
                    f"disable '{name}'",
                    "names no component of the pipeline",
                    did_you_mean(name, component_names),
                )
            )
    freeze_value = pipeline_cfg.get("freeze")
    frozen = component_names if freeze_value is True else []
    if freeze_value is not True:
        frozen, found = _names_list(freeze_value, "freeze", where("pipeline", "freeze"))
        problems += found
        for name in frozen:
            if name not in component_names:
                problems.append(
                    Problem(
                        where("pipeline", "freeze"),
                        f"freeze '{name}'",
                        "names no component of the pipeline",
                        did_you_mean(name, component_names),
                    )
                )

    for section in SECTIONS:
        section_cfg = config.get(section)
        if isinstance(section_cfg, Mapping) and section_cfg.get("task") is not None:
            entry, found = parse_entry(
                f"{section}.task", section_cfg["task"], (section, "task"), where, -1, True, unusable
            )
            problems += found
            if entry is not None:
                entries.append(entry)
    for index, name in enumerate(component_names):
        if name in disabled or name in disable:
            continue
        # The name also names files (`viewers/<name>-...png`, `artifacts/<name>/`).
        unfit = "it holds a '.'" if "." in name else file_name_problem(name)
        if unfit:
            problems.append(
                Problem(
                    where("pipeline", name),
                    f"component '{name}'",
                    f"a component name must be a plain file name with no '.': {unfit}",
                )
            )
            continue
        entry, found = parse_entry(
            name, pipeline_cfg[name], ("pipeline", name), where, index, False, unusable
        )
        problems += found
        if entry is None:
            continue
        entry.freeze = entry.freeze or name in frozen
        entries.append(entry)
    return entries, disabled, problems


def _unknown_renames(
    entry: ComponentEntry, kind: str, renamed: Mapping[str, str], known: set[str], where: Where
) -> list[Problem]:
    """A `streams:`, `globals:` or `dims:` key that names nothing the component has (a
    misspelling that would otherwise be ignored)."""
    nothing = {
        "stream": "which it neither reads nor writes",
        "global": "which it neither needs nor publishes",
        "dim": "which none of its streams has",
    }
    return [
        Problem(
            where(*entry.key_path, f"{kind}s"),
            entry.label,
            f"renames {kind} '{key}', {nothing[kind]}",
            did_you_mean(key, known) or f"its {kind}s: {', '.join(sorted(known)) or 'none'}",
        )
        for key in renamed
        if key not in known
    ]


def _check_global_renames(entry: ComponentEntry, where: Where) -> list[Problem]:
    known = set(entry.cls.needed_globals(entry.params)) | set(
        entry.cls.published_globals(entry.params)
    )
    return _unknown_renames(entry, "global", entry.global_names, known, where)


def _construction_order(
    entries: list[ComponentEntry], where: Where, unusable: set[str]
) -> tuple[list[ComponentEntry], list[Problem]]:
    """Publishers before readers; a global nobody publishes, or a cycle, is a problem (but
    for the `unusable` ones, whose publisher's parameters were refused: said already)."""
    publishers: dict[str, list[int]] = {}
    for i, entry in enumerate(entries):
        for name in entry.published():
            publishers.setdefault(name, []).append(i)
    problems: list[Problem] = []
    depends: list[set[int]] = []
    for i, entry in enumerate(entries):
        needs: set[int] = set()
        for actual, default in entry.needed().items():
            if actual not in publishers and actual not in unusable:
                renamed = f" (its '{default}')" if actual != default else ""
                problems.append(
                    Problem(
                        where(*entry.key_path, "globals"),
                        entry.label,
                        f"needs global '{actual}'{renamed}, which no component publishes",
                        did_you_mean(actual, publishers)
                        or f"published globals: {', '.join(sorted(publishers)) or 'none'}",
                    )
                )
            needs.update(j for j in publishers.get(actual, []) if j != i)
        depends.append(needs)
    order, stuck_indices = topological_order(depends)  # declaration order breaks ties
    stuck = [entries[i] for i in stuck_indices]
    if stuck:
        problems.append(
            Problem(
                where("pipeline"),
                "globals",
                "cycle: these components each need a global another of them "
                "publishes: " + ", ".join(e.label for e in stuck),
            )
        )
    return [entries[i] for i in order], problems


def _build_one(
    entry: ComponentEntry,
    store: GlobalsStore,
    where: Where,
    training_task: Callable[[], Task | None],
) -> Component:
    context = BuildContext(
        entry.name,
        entry.stream_names,
        entry.global_names,
        store,
        lambda *keys, _p=entry.key_path: where(*_p, *keys),
        entry.label,
        training_task,
        entry.dim_names,
    )
    try:
        component = entry.cls(entry.params, context)
    except (MemoryError, RuntimeError) as error:
        if not out_of_host_memory(error):
            raise
        raise ComponentError.at(
            where(*entry.key_path),
            entry.label,
            f"needs more memory than this machine has to be built ({first_line(error)})",
            "lower its sizes (`loom components` lists each key with its meaning)",
        ) from None
    # Publishing is part of the contract: a component that declares a global must publish it.
    for actual, default in entry.published().items():
        if actual not in store:
            raise ComponentError.at(
                where(*entry.key_path),
                entry.label,
                f"declares global '{default}' but did not publish it",
            )
    return component


class _NothingToFitTo(Exception):
    """A component asked for the training task, which failed to build."""


def _located(problem: Problem, entry: ComponentEntry, where: Where) -> Problem:
    """A data problem (a file, a folder) raised while a task was built, with the task and the
    config line that points at the data, so the user knows which section to fix."""
    return Problem(
        where(*entry.key_path),
        f"{entry.label}: {problem.where}",
        f"{problem.subject}: {problem.message}",
        problem.suggestion,
    )


def _check_stream_renames(
    component: Component, entry: ComponentEntry, where: Where
) -> list[Problem]:
    known = set(component.input_specs()) | set(component.output_specs())
    problems = _unknown_renames(entry, "stream", entry.stream_names, known, where)
    dims = component.dimension_names()
    if isinstance(component, Task):
        dims |= set(component.dimension_sizes())
    return problems + _unknown_renames(entry, "dim", entry.dim_names, dims, where)


def build_pipeline(
    config: Mapping[str, Any], where: Where, disable: Sequence[str] = ()
) -> Pipeline:
    """Build every task and component of `config`; raises one ComponentError listing all
    problems. `where(*keys)` names the file and line a config key came from."""
    unusable: set[str] = set()
    entries, _, problems = _parse_entries(config, where, disable, unusable)
    if not entries and not problems:
        problems.append(
            Problem(
                where(),
                "config",
                "defines no task and no component",
                "add a `pipeline:` section and a section task such as "
                "training.task (see `loom components`)",
            )
        )
    for entry in entries:
        problems += _check_global_renames(entry, where)
    ordered, found = _construction_order(entries, where, unusable)
    problems += found
    if problems:
        raise ComponentError(problems)

    store = GlobalsStore()
    built: dict[str, Component] = {}

    def training_task() -> Task | None:
        task = built.get("training.task")
        if task is None and training_task_failed:
            raise _NothingToFitTo
        return task if isinstance(task, Task) else None

    # Tasks that need no global first (they publish the globals that size everything else,
    # and components that fit themselves to the training data read the training task); the
    # sort is stable, so the global order holds among the rest.
    ordered = sorted(ordered, key=lambda e: not (issubclass(e.cls, Task) and not e.needed()))
    unbuilt_globals: set[str] = set()  # published by components that failed to build
    training_task_failed = False
    data_problems: set[Problem] = set()
    for entry in ordered:
        if unbuilt_globals & set(entry.needed()):
            # Its problems would only repeat that its publisher failed: skip it.
            unbuilt_globals |= set(entry.published())
            continue
        try:
            component = _build_one(entry, store, where, training_task)
        except _NothingToFitTo:  # it reads the training task, which failed: said already
            unbuilt_globals |= set(entry.published())
            continue
        except DataError as error:  # a file or folder: said with the section that reads it
            # ... once: two indexers reading one malformed training file are one problem.
            fresh = [p for p in error.problems if p not in data_problems]
            data_problems.update(fresh)
            problems += [_located(p, entry, where) for p in fresh]
            unbuilt_globals |= set(entry.published())
            training_task_failed |= entry.name == "training.task"
            continue
        except LoomError as error:
            problems += error.problems
            unbuilt_globals |= set(entry.published())
            training_task_failed |= entry.name == "training.task"
            continue
        problems += _check_stream_renames(component, entry, where)
        if entry.freeze:
            component.freeze()
        built[entry.name] = component
    training = built.get("training.task")
    for section in ("validation", "test"):
        task = built.get(f"{section}.task")
        if isinstance(task, Task) and isinstance(training, Task):
            problems += task.split_problems(training)
    if problems:
        # The sections' tasks often share a data folder: one missing folder, said once.
        raise ComponentError(list(dict.fromkeys(problems)))

    for entry in entries:
        if entry.load is not None:
            try:
                load_weights(built[entry.name], entry.load, where(*entry.key_path, "load"))
            except LoomError as error:
                problems += error.problems
    tasks = {e.name.split(".")[0]: built[e.name] for e in entries if issubclass(e.cls, Task)}
    components = [e for e in entries if not issubclass(e.cls, Task)]
    order, found = execution_order([(e, built[e.name]) for e in components], where)
    problems += found
    if problems:
        raise ComponentError(problems)
    return Pipeline(
        {section: task for section, task in tasks.items() if isinstance(task, Task)},
        [built[e.name] for e in order],
        store,
        {e.name: e for e in entries},
    )
