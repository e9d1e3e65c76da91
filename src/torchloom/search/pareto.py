"""The second measure of every trial, its size, and the Pareto front it makes with the
monitored statistic: search.html's "Pareto front" section.

Each trial records its pipeline's trainable parameters (user attribute `parameters`, set by
`ParameterCount` when the run starts). The front is the set of completed trials that no other
one beats on both the statistic (in the search's mode) and the size (fewer is better): the
best a search found at each size. The study itself stays single-objective (the sampler
optimises the statistic); the front is drawn over whatever the sampler evaluated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from torchloom.api import Hook, RunView, searchable_components

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

PARAMETERS = "parameters"  # the user attribute of a trial: its trainable parameters
# The user attribute of a trial whose size means nothing (why, one line): a trial that searches
# an architecture trains a supernet of every candidate operation, not the network it derives.
UNSIZED = "size_not_counted"
PLOT = "pareto.png"


P = TypeVar("P")


def pareto_front(points: Sequence[P], objectives: Callable[[P], Sequence[float]]) -> list[P]:
    """The points no other one dominates, every objective to be maximised (negate one to
    minimise it, e.g. the parameter count): at least as good in all, better in one."""

    def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
        return all(x >= y for x, y in zip(a, b, strict=True)) and any(
            x > y for x, y in zip(a, b, strict=True)
        )

    scored = [(p, tuple(objectives(p))) for p in points]
    return [p for p, s in scored if not any(dominates(t, s) for _, t in scored)]


class ParameterCount(Hook):
    """Records the trial's trainable parameters (every model of the pipeline) as it starts."""

    name = "search_parameter_count"

    def __init__(self, trial: optuna.trial.Trial) -> None:
        self.trial = trial

    def before_train(self, run: RunView) -> None:
        if searchable_components(run.pipeline):
            why = "it searches an architecture: its supernet is not the network derived.yml trains"
            self.trial.set_user_attr(UNSIZED, why)
            return
        count = sum(
            p.numel()
            for model in run.pipeline.models
            for p in model.parameters()
            if p.requires_grad
        )
        self.trial.set_user_attr(PARAMETERS, int(count))


def measured(study: optuna.Study) -> list[FrozenTrial]:
    """The completed trials that recorded their size."""
    from optuna.trial import TrialState

    return [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if isinstance(t.user_attrs.get(PARAMETERS), int) and t.value is not None
    ]


def value(trial: FrozenTrial) -> float:
    assert trial.value is not None  # measured() keeps completed trials only
    return float(trial.value)


def front(trials: list[FrozenTrial], mode: str) -> list[FrozenTrial]:
    """The Pareto front, smallest first."""
    sign = 1.0 if mode == "max" else -1.0
    kept = pareto_front(trials, lambda t: (sign * value(t), -t.user_attrs[PARAMETERS]))
    return sorted(kept, key=lambda t: (t.user_attrs[PARAMETERS], t.number))


def draw(path: Path, trials: list[FrozenTrial], kept: list[FrozenTrial], monitor: str) -> None:
    from torchloom.analysis.plotting import CURVE_MARGINS, figure, save_png

    fig = figure(6.4, 4.4, CURVE_MARGINS)
    ax = fig.add_subplot()
    sizes = [t.user_attrs[PARAMETERS] for t in trials]
    ax.scatter(sizes, [value(t) for t in trials], s=14, color="tab:blue", label="trials")
    ax.plot(
        [t.user_attrs[PARAMETERS] for t in kept],
        [value(t) for t in kept],
        "o-",
        color="tab:red",
        markersize=5,
        drawstyle="steps-post",
        label="Pareto front",
    )
    ax.set_xlabel("trainable parameters")
    ax.set_ylabel(monitor)
    ax.set_title(f"{len(trials)} trials, {len(kept)} on the Pareto front")
    ax.legend(loc="best", fontsize="small")
    data: dict[str, Any] = {
        "points": [[t.number, t.user_attrs[PARAMETERS], t.value] for t in trials],
        "front": [t.number for t in kept],
    }
    save_png(fig, path, data)


def section(search_dir: Path, study: optuna.Study, monitor: str, mode: str) -> list[str]:
    """search.html's section: the plot and the front's trials; nothing when no trial recorded
    its size (a search folder from before sizes were recorded)."""
    from torchloom.analysis.html_parts import escape, png_file_figure, table

    trials = measured(study)
    unsized = [t for t in study.get_trials(deepcopy=False) if UNSIZED in t.user_attrs]
    if unsized:
        reason = escape(unsized[0].user_attrs[UNSIZED])
        return [
            "<h2>Pareto front</h2>",
            f"<p>Not drawn: {len(unsized)} trial(s) recorded no size ({reason}).</p>",
        ]
    if not trials:
        return []
    kept = front(trials, mode)
    path = search_dir / "plots" / PLOT
    path.parent.mkdir(exist_ok=True)
    draw(path, trials, kept, monitor)
    rows = [
        [
            t.number,
            t.value,
            t.user_attrs[PARAMETERS],
            ", ".join(f"{k}={v}" for k, v in t.params.items()),
        ]
        for t in kept
    ]
    return [
        f"<h2>Pareto front: {escape(monitor)} against trainable parameters</h2>",
        png_file_figure(path, "every completed trial (blue) and the Pareto front (red)"),
        table(["trial", monitor, "parameters", "values"], rows),
    ]
