"""History curves: one PNG per statistic in `reports/history/<statistic>.png`.

Drawn from the run folder's CSV files, followed as the run appends to them (the hook keeps
each curve's bounded envelope, not the rows), so a resumed run draws its whole history. A
statistic gets a panel per epoch (training and validation epoch rows, x = epoch) and, where
interval rows have it, a panel per logging interval (training rows and partial validation
passes, x = episode); training and validation share a panel.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchloom.analysis.curve_points import Curves, FollowedCurves, finite
from torchloom.analysis.plotting import CURVE_MARGINS, PlotBudget, drawn_at_end, figure, save_png
from torchloom.analysis.schema import AnalysisConfig
from torchloom.engine.state import Hook

if TYPE_CHECKING:
    from torchloom.engine.state import RunView

# (panel, section) -> the run folder's CSV file it is drawn from.
SOURCES = {
    ("per epoch", "training"): "training_epoch_statistics.csv",
    ("per epoch", "validation"): "validation_epoch_statistics.csv",
    ("per interval", "training"): "training_statistics.csv",
    ("per interval", "validation"): "validation_statistics.csv",
}
X_AXIS = {"per epoch": "epoch", "per interval": "episode"}
# Counters and constants, not curves; min/max/std spread columns belong to their mean.
NOT_PLOTTED = {"epoch", "episode", "samples", "batch_size"}
SPREAD = ("_min", "_max", "_std")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")

Series = dict[str, dict[str, dict[str, tuple[list[float], list[float]]]]]


def _plotted(column: str) -> bool:
    return column not in NOT_PLOTTED and not column.endswith(SPREAD)


Pending = Mapping[tuple[str, str], Mapping[str, Any]]


class HistoryReader:
    """The history curves of one run folder, its CSV files followed as they grow
    (analysis/curve_points.py: each read takes the rows added since the last; a long run's
    every point until there are thousands, then each stretch's lowest and highest)."""

    def __init__(self, run_dir: Path) -> None:
        self.files = {
            source: FollowedCurves(run_dir / file, X_AXIS[source[0]], _plotted)
            for source, file in SOURCES.items()
        }

    def series(self, pending: Pending | None = None) -> Series:
        """`history_series` from the rows read so far (a line still being written waits)."""
        return _series({source: file.update() for source, file in self.files.items()}, pending)


def history_series(run_dir: Path, pending: Pending | None = None) -> Series:
    """statistic -> panel -> section -> (xs, ys), each file read whole, plus the `pending`
    rows (an event's row that the engine writes to its file only after the hooks have seen
    it; a row whose episode the file already has is not added twice)."""
    curves = {
        source: Curves(X_AXIS[source[0]], _plotted).read(run_dir / file)
        for source, file in SOURCES.items()
    }
    return _series(curves, pending)


def _series(curves: Mapping[tuple[str, str], Curves], pending: Pending | None) -> Series:
    series: Series = {}
    for (panel, section), read in curves.items():
        extra = (pending or {}).get((panel, section))
        last = read.last_row
        if extra and last and finite(last.get("episode")) == finite(extra.get("episode")):
            extra = None  # written already
        for key, points in read.points(extra).items():
            series.setdefault(key, {}).setdefault(panel, {})[section] = points
    return series


def draw_statistic(path: Path, statistic: str, panels: Mapping[str, Any]) -> None:
    from matplotlib.ticker import MaxNLocator  # matplotlib only once something is drawn

    fig = figure(5.0 * len(panels) + 1.0, 4.0, CURVE_MARGINS)
    for index, (panel, sections) in enumerate(sorted(panels.items())):
        ax = fig.add_subplot(1, len(panels), index + 1)
        for section, (xs, ys) in sorted(sections.items()):
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=section)
        ax.set(xlabel=X_AXIS[panel], ylabel=statistic, title=f"{statistic} {panel}")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs and episodes count
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save_png(fig, path, {"statistic": statistic, "panels": panels})


def draw_history(
    run_dir: Path,
    pending: Pending | None = None,
    drawn: dict[str, Any] | None = None,
    reader: HistoryReader | None = None,
) -> list[Path]:
    """(Re)draw the PNG of every statistic whose curves differ from `drawn` (statistic ->
    the curves drawn last, updated here; None: draw all), read by `reader` (each file read
    whole when None). Returns the files written."""
    folder = run_dir / "reports" / "history"
    written = []
    series = reader.series(pending) if reader else history_series(run_dir, pending)
    for statistic, panels in sorted(series.items()):
        if drawn is not None and drawn.get(statistic) == panels:
            continue  # reading the CSV files is cheap, drawing is not
        path = folder / f"{_UNSAFE.sub('-', statistic)}.png"
        draw_statistic(path, statistic, panels)
        written.append(path)
        if drawn is not None:
            drawn[statistic] = panels
    return written


class HistoryPlots(Hook):
    """Redraws the history curves once per epoch (after validation, when there is one),
    within the run's plotting budget, and at the end of the run; only the statistics whose
    curves changed since they were last drawn."""

    name = "history_plots"

    def __init__(self, config: AnalysisConfig, budget: PlotBudget | None = None) -> None:
        # Shared with the run's other plotting hooks (analysis/build.py): together within it.
        self.budget = budget if budget is not None else PlotBudget()
        self.config = config
        self.drawn: dict[str, Any] = {}
        self.reader: HistoryReader | None = None  # the run folder's, made before training

    def before_train(self, run: RunView) -> None:
        self.budget.start()  # the plotting budget counts the run's time from its start
        self.reader = HistoryReader(run.run_dir)

    def after_training_epoch(self, run: RunView, values: dict[str, Any]) -> None:
        validation_follows = not run.online and run.validation_data is not None
        if not validation_follows:  # else drawn once, after the validation pass
            self._draw(run, {("per epoch", "training"): values}, force=False)

    def after_eval(self, run: RunView, section: str, values: dict[str, Any], partial: bool) -> None:
        if section == "validation" and not partial:
            p = run.progress
            row = {"epoch": p.row_epoch, "episode": p.episode, **values}
            self._draw(run, {("per epoch", "validation"): row}, force=False)

    def after_train(self, run: RunView, summary: dict[str, Any]) -> None:
        if drawn_at_end(summary):
            self._draw(run, None, force=True)  # every file is complete by now

    def _draw(
        self,
        run: RunView,
        pending: Pending | None,
        force: bool,
    ) -> None:
        budget = self.budget
        if force or budget.due("history"):
            with budget.timed("history"):
                draw_history(run.run_dir, pending, self.drawn, self.reader)
