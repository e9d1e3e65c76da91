"""`loom compare RUN_A RUN_B ...`: runs side by side on one self-contained HTML page.

The page holds one table of the runs' summaries and statistics (one column per run: each
statistic at the run's best evaluation, the best of them highlighted, and at its last epoch
where that differs), their history curves overlaid (one plot per
statistic and split, one line per run, against the epoch, which is comparable across batch
sizes where episodes are not) and the config keys whose values differ. An existing output
file is never overwritten without `force`, and every run is read before anything is written:
bad input never destroys earlier results.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torchloom.analysis.html_parts import escape, figure, line_plot, page, table
from torchloom.analysis.run_reading import (
    SPLITS,
    Run,
    format_number,
    lower_is_better,
    plotted_statistics,
    read_run,
)
from torchloom.config.dumping import flatten_config
from torchloom.config.limits import MAX_FILE_BYTES
from torchloom.config.yaml_reader import parse_config_text
from torchloom.core.file_names import WORKER_FILES, file_name_problem
from torchloom.data.atomic_files import write_text_atomic
from torchloom.errors import ConfigError

# Final statistics that are settings or counts, not results: shown, never highlighted.
NOT_RANKED = ("samples", "lr", "batch_size")


def _labels(runs: Sequence[Run]) -> list[str]:
    labels: list[str] = []
    for run in runs:
        label, number = run.label, 2
        while label in labels:
            label, number = f"{run.label} ({number})", number + 1
        labels.append(label)
    return labels


def _best_columns(values: Sequence[float | None], name: str, runs: Sequence[Run]) -> set[int]:
    last = name.rsplit(".", 1)[-1]
    numbers = [v for v in values if v is not None and v == v]  # v == v: not NaN
    if len(numbers) < 2 or len(set(numbers)) == 1 or last in NOT_RANKED or last.endswith("_std"):
        return set()
    best = min(numbers) if lower_is_better(name, runs) else max(numbers)
    return {i for i, v in enumerate(values) if v == best}


def summary_table(runs: Sequence[Run], labels: Sequence[str]) -> str:
    rows: list[list[object]] = []
    best: list[set[int]] = []

    def add(name: str, cells: Sequence[object], ranked: set[int] | None = None) -> None:
        rows.append([name, *("" if c is None else c for c in cells)])
        best.append({i + 1 for i in (ranked or set())})

    add("pipeline", [r.pipeline for r in runs])
    add("date", [r.date for r in runs])
    add("status", [r.status_text() for r in runs])
    for key in ("epochs", "episodes", "wall_time_seconds", "seed", "device"):
        add(key.replace("_", " "), [str(r.summary.get(key, "")) for r in runs])
    monitors = [r.monitor() for r in runs]
    add("best monitored", [f"{n}={format_number(b)}" if n else "" for n, b, _ in monitors])
    finals = [r.final() for r in runs]
    names: list[str] = []
    for section in SPLITS:
        for final in finals:
            names += [k for k in final if k.startswith(f"{section}.") and k not in names]
    for final in finals:
        names += [k for k in final if k not in names]
    for name in names:
        # Ranked as `loom runs` ranks: the best evaluation's value (the weights in best.pt,
        # with which the test pass measured), beside the last epoch's where that differs.
        chosen = [run.statistic(name) for run in runs]
        add(name, chosen, _best_columns(chosen, name, runs))
        last = [final.get(name) for final in finals]
        if last != chosen:
            add(f"{name} (last epoch)", last)
    return table(["", *labels], rows, best)


def history_overlays(runs: Sequence[Run], labels: Sequence[str]) -> list[tuple[str, bytes]]:
    """(split.statistic, PNG) with one line per run against the epoch."""
    histories = [run.history_curves("epoch") for run in runs]
    plots = []
    for split in ("training", "validation"):
        columns: set[str] = set()
        for history in histories:
            columns |= set(history.get(split, {}))
        for statistic in plotted_statistics(columns):
            series = [
                (label, *history[split][statistic])
                for label, history in zip(labels, histories, strict=True)
                if statistic in history.get(split, {})
            ]
            if series:
                name = f"{split}.{statistic}"
                plots.append((name, line_plot(name, series, x_label="epoch", legend=True)))
    return plots


def _flatten(value: Any) -> dict[str, str]:
    """Every leaf as text, by dotted key (strings as they are, the rest as JSON)."""
    return {
        key: item if isinstance(item, str) else json.dumps(item, default=str)
        for key, item in flatten_config(value).items()
    }


def config_differences(runs: Sequence[Run]) -> list[list[str]]:
    """[key, value per run] for every config key whose value differs ('' where absent)."""
    flats = []
    for run in runs:
        text, size = run.config_text()
        if size > MAX_FILE_BYTES:  # the text is cut: not parsed as if it were whole
            data = {"config.yaml": f"(cannot be read: has {size:,} bytes, more than a config)"}
        else:
            try:  # read within the config limits: a hand-edited file may hold anything
                data = parse_config_text(text, str(run.path / "config.yaml")).data
            except ConfigError as error:
                data = {"config.yaml": f"(cannot be read: {error.problems[0].message})"}
        flats.append(_flatten(data if isinstance(data, dict) else {"config.yaml": data}))
    keys = sorted({key for flat in flats for key in flat})
    rows = []
    for key in keys:
        values = [flat.get(key) for flat in flats]
        if len(set(values)) > 1:
            rows.append([key, *("(absent)" if v is None else v for v in values)])
    return rows


def comparison_html(runs: Sequence[Run]) -> str:
    labels = _labels(runs)
    differences = config_differences(runs)
    plots = history_overlays(runs, labels)
    body = [
        f"<h1>Comparison of {len(runs)} runs</h1>",
        "<ul>" + "".join(f"<li>{escape(r.path)}</li>" for r in runs) + "</ul>",
        '<nav><a href="#statistics">statistics</a><a href="#history">history</a>'
        '<a href="#config">config differences</a></nav>',
        '<h2 id="statistics">Summaries and final statistics</h2>',
        "<p>best value per statistic highlighted (highest, or lowest for losses and errors)</p>",
        summary_table(runs, labels),
        '<h2 id="history">History</h2>',
        *(
            [figure(data, name, show_caption=False) for name, data in plots]
            or ['<p class="absent">no per-epoch statistics in these runs</p>']
        ),
        '<h2 id="config">Config differences</h2>',
        table(["key", *labels], differences) if differences else "<p>the configs are identical</p>",
    ]
    return page(f"compare {', '.join(labels)}", body)


def write_comparison(
    run_dirs: Sequence[str | Path], output: str | Path = "compare.html", force: bool = False
) -> Path:
    """Write the comparison page of `run_dirs` to `output` and return its path."""
    target = Path(output).expanduser()
    subject = f"output '{output}'"
    problem = file_name_problem(target.name)
    if problem and target.name:  # a name too long for the file system was a traceback
        raise ConfigError.at("", subject, f"cannot be a file name: {problem}")
    if target.is_dir():
        raise ConfigError.at("", subject, "is a folder", "name an .html file")
    # Only a page is replaced, even with --force: `-o RUN/summary.json --force` made a run's
    # summary (or a checkpoint) an HTML page.
    if target.suffix.lower() not in (".html", ".htm"):
        raise ConfigError.at(
            "",
            subject,
            "is not an .html file (the page replaces the file it names)",
            "name an .html file, e.g. -o compare.html",
        )
    # Nor a compared run's own file (its report.html), which --force replaced.
    inside = [r for r in run_dirs if Path(r).resolve() in target.resolve().parents]
    if inside and (target.exists() or target.name in WORKER_FILES):
        raise ConfigError.at(
            "", subject, f"is a file of the compared run folder '{inside[0]}'", "write it elsewhere"
        )
    if target.exists() and not force:
        raise ConfigError.at("", subject, "exists already", "pass --force to overwrite it")
    if not target.parent.is_dir():
        raise ConfigError.at("", subject, f"folder '{target.parent}' does not exist")
    if len(run_dirs) < 2:
        raise ConfigError.at("", "loom compare", "needs at least two run folders")
    runs = [read_run(path) for path in run_dirs]
    try:
        write_text_atomic(target, comparison_html(runs))
    except OSError as error:
        raise ConfigError.at("", subject, f"cannot be written: {error}") from error
    return target
