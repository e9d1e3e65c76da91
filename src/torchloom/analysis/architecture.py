"""The architecture a DARTS search is learning, as heat maps: `reports/architecture/
<component>-alphas.png`, the softmax of the architecture parameters per edge (rows,
'node<-source') and candidate operation (columns), normal and reduction cells side by side.

Drawn within the run's plot budget after training epochs, and always at the end of the
run, from the searchable components themselves (any component with `alpha_softmax()`,
`edge_labels()` and `operation_labels()`); the numbers of every epoch are in the run's
`architecture/alphas.json` (engine/architecture_search.py), so nothing is kept here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchloom.analysis.plotting import PlotBudget, drawn_at_end, figure, save_png
from torchloom.analysis.schema import AnalysisConfig
from torchloom.core.pipeline import Pipeline
from torchloom.engine.state import Hook

if TYPE_CHECKING:
    from torchloom.engine.state import RunView

KIND = "architecture"


def searchable_components(pipeline: Pipeline) -> dict[str, Any]:
    names = ("alpha_softmax", "edge_labels", "operation_labels")
    return {
        name: component
        for name, component in pipeline.components.items()
        if all(callable(getattr(component, n, None)) for n in names)
    }


def searchable(run: RunView) -> dict[str, Any]:
    return searchable_components(run.pipeline)


def draw_alphas(run: RunView, name: str, component: Any, epoch: int) -> None:
    softmax = component.alpha_softmax()
    edges, operations = component.edge_labels(), component.operation_labels()
    width = 1.6 + 0.45 * len(operations) * len(softmax)
    fig = figure(width, 1.6 + 0.3 * len(edges))
    axes = fig.subplots(1, len(softmax), squeeze=False)[0]
    for ax, (kind, rows) in zip(axes, softmax.items(), strict=True):
        image = ax.imshow(rows, cmap="viridis", vmin=0.0, aspect="auto")
        ax.set_title(f"{kind} cell")
        ax.set_xticks(range(len(operations)), operations, rotation=60, ha="right", fontsize=7)
        ax.set_yticks(range(len(edges)), edges, fontsize=7)
        fig.colorbar(image, ax=ax, fraction=0.05)
    fig.suptitle(f"'{name}': softmax of the architecture parameters after epoch {epoch}")
    path = run.run_dir / "reports" / "architecture" / f"{name}-alphas.png"
    save_png(fig, path, {"epoch": epoch, "edges": edges, "operations": operations, **softmax})


class ArchitecturePlots(Hook):
    name = "architecture_plots"

    @staticmethod
    def applies(pipeline: Pipeline) -> bool:
        """Built only for a pipeline with a searchable component."""
        return bool(searchable_components(pipeline))

    def __init__(self, config: AnalysisConfig, budget: PlotBudget | None = None) -> None:
        self.budget = budget or PlotBudget()
        self.drawn_epoch = -1

    def before_train(self, run: RunView) -> None:
        self.budget.start()

    def _draw(self, run: RunView) -> None:
        epoch = run.progress.epoch
        with self.budget.timed(KIND):
            for name, component in searchable(run).items():
                draw_alphas(run, name, component, epoch)
        self.drawn_epoch = epoch

    def after_training_epoch(self, run: RunView, values: dict[str, Any]) -> None:
        if searchable(run) and self.budget.due(KIND):
            self._draw(run)

    def after_train(self, run: RunView, summary: dict[str, Any]) -> None:
        if searchable(run) and self.drawn_epoch != run.progress.epoch and drawn_at_end(summary):
            self._draw(run)
