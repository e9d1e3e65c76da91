"""search.html: one self-contained page about a search, in the style of a run's report: the
best trial and its config, the table of trials, parameter importance, and Optuna's plots
(importance bars, each parameter against the statistic, optimisation history, every trial's
learning curve with the pruned ones, parallel coordinates), saved as PNGs under plots/, and
the Pareto front of the statistic against the trials' sizes (pareto.py)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchloom.analysis.html_parts import escape, page, png_file_figure, table
from torchloom.data.atomic_files import write_text_atomic
from torchloom.search.pareto import section as pareto_section
from torchloom.search.record import SearchRecord
from torchloom.search.results import SearchResults, make_evaluator, sampled_values
from torchloom.search.storage_urls import hide_password

PAGE = "search.html"


def _plots() -> dict[str, tuple[str, Callable[..., Any]]]:
    from optuna.visualization import matplotlib as vis

    return {
        "importance": ("parameter importance", vis.plot_param_importances),
        "slice": ("each parameter against the statistic", vis.plot_slice),
        "history": ("optimisation history", vis.plot_optimization_history),
        "intermediate": (
            "learning curves (pruned trials stop early)",
            vis.plot_intermediate_values,
        ),
        "parallel": ("parallel coordinates", vis.plot_parallel_coordinate),
    }


def draw_plots(search_dir: Path, results: SearchResults, monitor: str) -> dict[str, str]:
    """The PNGs that could be drawn ({name: caption}). Before any trial completed only the
    learning curves can be; a plot Optuna cannot draw is left out of the page (which then
    says so), not warned about."""
    import matplotlib
    import optuna

    matplotlib.use("Agg")
    folder = search_dir / "plots"
    folder.mkdir(exist_ok=True)
    drawn: dict[str, str] = {}
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        for name, (caption, plot) in _plots().items():
            if results.best is None and name != "intermediate":
                continue
            if name == "importance" and not results.importance:
                continue
            if _draw(folder / f"{name}.png", name, plot, results, monitor):
                drawn[name] = caption
    finally:
        optuna.logging.set_verbosity(verbosity)
    return drawn


def _draw(
    path: Path, name: str, plot: Callable[..., Any], results: SearchResults, monitor: str
) -> bool:
    import matplotlib.pyplot as plt

    kwargs: dict[str, Any] = {}
    if name in ("slice", "history", "parallel", "importance"):
        kwargs["target_name"] = monitor
    if name == "importance":
        kwargs["evaluator"] = make_evaluator(results.importance_note)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            axes = plot(results.study, **kwargs)
    except (ValueError, RuntimeError, ZeroDivisionError):
        return False
    first = axes.flat[0] if hasattr(axes, "flat") else axes
    figure = first.get_figure()
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return True


def write_page(search_dir: Path, record: SearchRecord, results: SearchResults) -> Path:
    drawn = draw_plots(search_dir, results, record.monitor)
    body = [f"<h1>search {escape(record.name)}</h1>", _summary(search_dir, record, results)]
    body.append("<h2>trials</h2>")
    if results.rows:
        headers = list(results.rows[0])
        body.append(table(headers, [[row[h] for h in headers] for row in results.rows]))
    body.append("<h2>parameter importance</h2>")
    if results.importance:
        rows = [[name, round(value, 4)] for name, value in results.importance.items()]
        body.append(table(["parameter", f"importance ({results.importance_note})"], rows))
    else:
        body.append(f'<p class="absent">{escape(results.importance_note)}</p>')
    body.append("<h2>plots</h2>")
    for name, caption in drawn.items():
        body.append(png_file_figure(search_dir / "plots" / f"{name}.png", caption))
    if not drawn:
        body.append('<p class="absent">no plot yet: no trial completed</p>')
    body += pareto_section(search_dir, results.study, record.monitor, record.mode)
    path = search_dir / PAGE
    write_text_atomic(path, page(f"search {record.name}", body))
    return path


def _summary(search_dir: Path, record: SearchRecord, results: SearchResults) -> str:
    counts: dict[str, int] = {}
    for row in results.rows:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    states = ", ".join(f"{n} {state}" for state, n in counts.items()) or "none"
    lines = [
        f"<p>study <b>{escape(record.study)}</b> ({escape(hide_password(record.storage))}), "
        f"{escape(record.mode)} <b>{escape(record.monitor)}</b>; trials: {escape(states)}</p>"
    ]
    best = results.best
    if best is not None:
        params = ", ".join(f"{k} = {v}" for k, v in sampled_values(best).items())
        lines.append(
            f"<p>best: trial {best.number}, {escape(record.monitor)} = "
            f"{best.value:.6g} ({escape(params)}); its config: "
            f'<a href="best.yml">best.yml</a> (<code>loom train best.yml</code>)</p>'
        )
        config = search_dir / "best.yml"
        if config.is_file():
            lines.append(f"<pre>{escape(config.read_text(encoding='utf-8'))}</pre>")
    return "\n".join(lines)
