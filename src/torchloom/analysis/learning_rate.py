"""Learning rates: what a run used (`LearningRateRecorder`); what it should use is the range
test's (`analysis/lr_find.py`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchloom.analysis.curve_points import read_curves
from torchloom.analysis.plotting import CURVE_MARGINS, drawn_at_end, figure, save_png
from torchloom.analysis.schema import AnalysisConfig
from torchloom.engine.state import Hook
from torchloom.statistics.csv_log import CsvLog

if TYPE_CHECKING:
    from torchloom.engine.state import RunView


# ---- recording a run's rates -----------------------------------------------------------------
def group_labels(run: RunView) -> list[str]:
    """Per optimizer parameter group, the components whose weights it holds."""
    owners = {
        id(p): name
        for name, component in run.pipeline.components.items()
        for p in component.parameters()
    }
    return [
        "+".join(sorted({owners.get(id(p), "?") for p in group["params"]})) or "?"
        for group in run.optimizer.param_groups
    ]


class LearningRateRecorder(Hook):
    """Every parameter group's learning rate at the start and at each logging interval, in
    `reports/learning_rate.csv` (columns `lr_group_<i>`); `reports/learning_rate.png` at the
    end. Rates are read only at logging intervals, never per step."""

    name = "learning_rate"

    def __init__(self, config: AnalysisConfig) -> None:
        self.config = config
        self.csv: CsvLog | None = None

    def before_train(self, run: RunView) -> None:
        folder = run.run_dir / "reports"
        folder.mkdir(exist_ok=True)
        # A resumed run drops rows past its checkpoint, as the statistics files do.
        self.csv = CsvLog(folder / "learning_rate.csv", run.progress.episode)
        if run.progress.episode == 0:
            self._record(run, epoch=0)

    def after_interval(self, run: RunView) -> None:
        self._record(run, epoch=run.progress.epoch + 1)  # the epoch in progress, as the engine

    def after_train(self, run: RunView, summary: dict[str, Any]) -> None:
        if self.csv is None or not self.csv.path.is_file() or not drawn_at_end(summary):
            return
        # In bounded memory, every spike kept: a row per logging interval (curve_points.py).
        curves = read_curves(self.csv.path, "episode")
        labels = group_labels(run)
        fig = figure(6.4, 4.0, CURVE_MARGINS)
        ax = fig.add_subplot()
        for index, label in enumerate(labels):
            episodes, rates = curves.get(f"lr_group_{index}", ([], []))
            ax.plot(episodes, rates, label=f"group {index}: {label}")
        rates = [y for name, (_, ys) in curves.items() if name.startswith("lr_") for y in ys]
        if rates and min(rates) > 0 and max(rates) > 10 * min(rates):
            ax.set_yscale("log")
        ax.set(xlabel="episode", ylabel="learning rate", title="learning rate")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        save_png(fig, run.run_dir / "reports" / "learning_rate.png")

    def _record(self, run: RunView, epoch: int) -> None:
        assert self.csv is not None, "before_train opens the file"
        row: dict[str, Any] = {"episode": run.progress.episode, "epoch": epoch}
        for index, group in enumerate(run.optimizer.param_groups):
            row[f"lr_group_{index}"] = float(group["lr"])
        self.csv.write(row)
