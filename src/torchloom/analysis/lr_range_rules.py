"""The range test's two rules: where the raw loss diverged, and which rate to suggest.

Both read the RAW loss of every step of the ramp (one batch each, so it is noisy). Smoothing
first and judging the smoothed curve, as the usual exponential moving average does, hides
what matters: with the customary factor 0.98 the average trails the raw loss by about 50
steps, half a 100-step ramp, so a spike to 44 that leaves the network dead at the chance
loss barely moves it, and its steepest fall lies where the raw loss has already diverged.

Divergence (`DivergenceWatch`, fed one raw loss per step) is the first of:

- the raw loss is not finite (NaN or infinite);
- a spike: one raw loss above both `SPIKE` (4) times the best loss and half-way back from
  the best loss to the starting loss;
- a relapse: once the loss has fallen to `LEARNT` (3/4) of the starting loss or below,
  `RELAPSE_STEPS` (3) raw losses in a row above half-way back (the network died: a plateau
  at the chance loss, often after a spike); divergence began at the first of them.

The starting loss is the median of the first `START_STEPS` (5) raw losses: at the ramp's tiny
first rates the network is still untrained, so for a classifier it is the chance loss. The
best loss is the lowest mean of three consecutive raw losses so far (one lucky batch is no
best). Ratios mean nothing for a loss that can be negative: then only non-finite losses and
relapses count.

The suggestion (`suggest`) is the rate where the raw loss, smoothed by a centred moving
average (`smoothing_window`: a tenth of the ramp, at least 5 steps), falls fastest against
log(rate), among the steps before divergence whose window lies whole before it. A centred
average does not lag. When too few steps come before divergence, or the loss never falls
there, there is no suggestion, only the reason (`Suggestion.rate` is None). Falling means
more than wandering: the smoothed loss's lowest value lies below its first by `FALL` (5%) of
the starting loss and by `NOISE_FALLS` (3) times the batch noise.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SPIKE = 4.0  # a single raw loss this many times the best one (and half-way back) diverged
LEARNT = 0.75  # relapses count once the loss fell to this fraction of the starting loss
RELAPSE_STEPS = 3  # raw losses in a row above half-way back from the best to the start
START_STEPS = 5  # the starting loss is the median of this many first raw losses
BEST_OF = 3  # the best loss is the lowest mean of this many consecutive raw losses
FALL = 0.05  # a suggestion needs the smoothed loss to fall by this fraction of the start...
NOISE_FALLS = 3.0  # ... and by this many times the batch noise
RULE = "steepest fall of the loss, centred moving average over {window} steps, against log(lr)"


@dataclass(frozen=True)
class Divergence:
    began: int  # index of the ramp step where divergence began
    detected: int  # index of the step that confirmed it (a relapse needs several)
    reason: str


class DivergenceWatch:
    """Feed `add` the raw loss of each step in turn; it returns the divergence once seen."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.best = math.inf
        self.above: list[int] = []  # the current run of steps above half-way back
        self.divergence: Divergence | None = None

    def add(self, loss: float) -> Divergence | None:
        step = len(self.losses)
        if self.divergence is None:
            self.divergence = self._judge(step, loss)
        self.losses.append(loss)
        if math.isfinite(loss) and self.divergence is None:
            recent = self.losses[-BEST_OF:]
            self.best = min(self.best, sum(recent) / len(recent))
        return self.divergence

    def _judge(self, step: int, loss: float) -> Divergence | None:
        if not math.isfinite(loss):
            return Divergence(step, step, f"the raw loss became {loss}")
        if not self.losses:
            return None
        start = statistics.median(self.losses[:START_STEPS])
        best = self.best
        halfway = best + 0.5 * (start - best)
        if best > 0 and loss > max(SPIKE * best, halfway):
            return Divergence(
                step,
                step,
                f"the raw loss jumped to {loss:.4g}, over {SPIKE:g}x its best {best:.4g} "
                f"(starting loss {start:.4g})",
            )
        learnt = best <= LEARNT * start if start > 0 else best < start
        if not (learnt and loss > halfway):
            self.above = []
            return None
        self.above.append(step)
        if len(self.above) < RELAPSE_STEPS:
            return None
        return Divergence(
            self.above[0],
            step,
            f"the raw loss stayed above {halfway:.4g}, half-way back from its best "
            f"{best:.4g} to its starting {start:.4g}, for {RELAPSE_STEPS} steps",
        )


def find_divergence(losses: Sequence[float]) -> Divergence | None:
    """The first divergence of a whole series of raw losses (see the module docstring)."""
    watch = DivergenceWatch()
    for loss in losses:
        if watch.add(loss) is not None:
            break
    return watch.divergence


def smoothing_window(steps: int) -> int:
    """The centred moving average's width for a ramp of `steps`: odd, a tenth, at least 5."""
    return max(5, (steps // 10) | 1)


def centred_average(values: Sequence[float], window: int) -> list[float]:
    """Each value averaged with its neighbours, `window // 2` on each side (fewer at the
    ends: those averages are not centred, which is why `suggest` never picks them)."""
    half = window // 2
    array = np.asarray(values, dtype=float)
    return [float(array[max(0, i - half) : i + half + 1].mean()) for i in range(len(array))]


@dataclass(frozen=True)
class Suggestion:
    rate: float | None  # None: no rate can be trusted, see `problem`
    step: int | None  # index of the chosen step
    rule: str
    problem: str = ""  # why there is no suggestion


def suggest(
    learning_rates: Sequence[float],
    losses: Sequence[float],
    window: int,
    divergence: Divergence | None,
) -> Suggestion:
    """The rate where the centred average of the raw loss falls fastest against log(rate),
    before divergence began (see the module docstring)."""
    rule = RULE.format(window=window)
    end = divergence.began if divergence is not None else len(losses)
    half = window // 2
    if end < window + 2:  # fewer than 3 steps with a whole window before divergence
        return Suggestion(
            None,
            None,
            rule,
            f"only {end} step(s) came before it; {window + 2} are needed to measure where "
            "the loss falls fastest",
        )
    rates = np.log(np.asarray(learning_rates[:end], dtype=float))
    smoothed = np.asarray(centred_average(losses[:end], window))
    before = " before it" if divergence is not None else ""
    fell = _fall_problem(np.asarray(losses[:end], dtype=float), smoothed, half, before)
    if fell:
        return Suggestion(None, None, rule, fell)
    slopes = np.gradient(smoothed, rates)[half : end - half]
    chosen = int(np.argmin(slopes))
    if not slopes[chosen] < 0:
        return Suggestion(None, None, rule, f"the smoothed loss never fell{before}")
    step = chosen + half
    return Suggestion(float(learning_rates[step]), step, rule)


def _fall_problem(raw: np.ndarray, smoothed: np.ndarray, half: int, before: str) -> str:
    """Why the smoothed loss did not really fall (empty when it did): its lowest value, among
    those whose window is whole, must lie below its first by `FALL` of the starting loss and
    by `NOISE_FALLS` times the batch noise. Without it the steepest wiggle of a loss that only
    wandered would be suggested. The noise is read from the differences of consecutive raw
    losses (their median absolute deviation): a trend, or a bend where the loss starts to
    fall, hardly moves them, as they would the spread about a moving average."""
    whole = smoothed[half : len(smoothed) - half]
    start = float(statistics.median(raw[:START_STEPS]))
    steps = np.diff(raw)
    # For independent batch noise of deviation s, a difference has deviation s * sqrt(2);
    # 1.4826 x the median absolute deviation estimates a normal deviation.
    noise = float(1.4826 * np.median(np.abs(steps - np.median(steps))) / math.sqrt(2))
    fall = float(whole[0] - whole.min())
    needed = max(FALL * abs(start), NOISE_FALLS * noise)
    if fall > needed:
        return ""
    return (
        f"the smoothed loss never fell by more than its noise{before}: from {whole[0]:.4g} to "
        f"{whole.min():.4g} at its lowest, a fall of {fall:.3g} where {needed:.3g} is needed "
        f"({FALL:.0%} of the starting loss {start:.4g}, and {NOISE_FALLS:g}x the batch noise "
        f"{noise:.3g})"
    )
