"""Shared plotting helpers for analysis reports: PNG figures with matplotlib's Agg renderer.

matplotlib is imported inside the functions, never at module level, so `import torchloom`
(and a run whose analysis draws nothing) does not pay its import time. Figures are made with
`matplotlib.figure.Figure`, not pyplot: no global figure registry to leak into, and no
interactive backend to pick, so drawing is safe in a headless worker and in tests.

    fig = figure(6, 4, CURVE_MARGINS)
    ax = fig.add_subplot()
    ax.plot(xs, ys)
    save_png(fig, run_dir / "reports" / "curve.png", {"x": xs, "y": ys})
    png_data(run_dir / "reports" / "curve.png")  # {"x": ..., "y": ...}: what tests check

`PlotBudget` keeps a run's plotting under a fixed share of its wall time; the hooks that plot
into one run share one budget, which the hook factory (analysis/build.py) hands them.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchloom.data.atomic_files import atomic_file

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 100


Margins = tuple[float, float, float, float]  # left, bottom, right, top, in inches
# Room for numeric tick labels, an axis label and a title: what most curves need.
CURVE_MARGINS: Margins = (0.85, 0.55, 0.2, 0.4)


def figure(width: float = 6.4, height: float = 4.8, margins: Margins | None = None) -> Figure:
    """A new figure of `width` x `height` inches. With `margins` (inches around the plots;
    `CURVE_MARGINS` suits most curves) the layout is fixed; without, matplotlib's
    constrained layout fits labels of any length, at about twice the drawing time."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(
        figsize=(width, height), dpi=DPI, layout="constrained" if margins is None else None
    )
    FigureCanvasAgg(fig)  # attaches itself: savefig renders with Agg, whatever pyplot uses
    if margins is not None:
        left, bottom, right, top = margins
        fig.subplots_adjust(
            left=left / width,
            bottom=bottom / height,
            right=1 - right / width,
            top=1 - top / height,
            wspace=0.25,  # side by side panels: room for the right one's tick labels
        )
    return fig


def save_png(fig: Figure, path: Path, data: Mapping[str, Any] | None = None) -> None:
    """Write `fig` as a PNG through a temporary file and a rename, so a reader (an HTML
    report refreshing, a test) never sees half an image. `data` (JSON-able) goes into the
    PNG's text chunk `torchloom`, so the picture carries the numbers it shows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {"torchloom": json.dumps(data)} if data is not None else None
    with atomic_file(path) as out:
        fig.savefig(out, format="png", dpi=DPI, metadata=metadata)


def drawn_at_end(summary: Mapping[str, Any]) -> bool:
    """Whether a run's end-of-run drawings are worth their time: not for a run a hook
    stopped (a trial its search pruned, often after one short epoch, which the drawings
    would outlast). Its statistics CSVs hold the numbers, its search's page draws its curve,
    and `loom report RUN_DIR` draws its curves from the CSVs."""
    return summary.get("status") != "stopped"


def png_data(path: Path) -> Any:
    """The `data` that `save_png` stored in a PNG (None when there is none)."""
    from PIL import Image

    with Image.open(path) as image:
        text = image.info.get("torchloom")
    return json.loads(text) if text is not None else None


class PlotBudget:
    """Keeps the time spent drawing during a run under `fraction` of its wall time since the
    budget was made; what is not drawn then is drawn at the end of the run. The analysis may
    add 5% to an epoch, and the per-step counting and the reports' text files take their
    share of that, so drawing gets 1%.

    A drawing is due only when its expected cost still fits: `due(kind)` adds what the last
    drawing of that kind took (before the first, `FIRST_GUESS`) to the time spent so far.
    Checking only the time spent so far let one drawing of half a second overshoot the budget
    of a short epoch several times over."""

    # Seconds, before a kind was drawn once: a few PNGs (a confusion matrix takes about 0.3 s).
    # A short run (under 100 s) draws at its end only.
    FIRST_GUESS = 1.0

    def __init__(self, fraction: float = 0.01) -> None:
        self.fraction = fraction
        self.started = time.perf_counter()
        self.spent = 0.0
        self.last_cost: dict[str, float] = {}

    def start(self) -> None:
        """Count the run's time from now (every hook that plots calls it before training)."""
        if self.spent == 0.0:
            self.started = time.perf_counter()

    def due(self, kind: str) -> bool:
        expected = self.last_cost.get(kind, self.FIRST_GUESS)
        return self.spent + expected <= self.fraction * (time.perf_counter() - self.started)

    @contextlib.contextmanager
    def timed(self, kind: str) -> Iterator[None]:
        """Charge the time spent inside the block to the budget, as a drawing of `kind`."""
        started = time.perf_counter()
        try:
            yield
        finally:
            cost = time.perf_counter() - started
            self.spent += cost
            self.last_cost[kind] = cost
