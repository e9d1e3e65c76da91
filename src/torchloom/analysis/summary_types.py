"""The types of summary.json's fields, as the training loop writes them (engine/trainer.py).

A summary.json is read back by `loom runs`, `loom report` and `loom compare`; a field of the
wrong type (edited by hand, written by another program) is named here, so that a reader never
crashes on it and never shows a wrong number.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: Any) -> bool:  # NaN and infinities included: a diverged run has them
    return isinstance(value, int | float) and not isinstance(value, bool)


def _or_null(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


# field -> (check, what it must be); every field may be absent (a running run has two)
_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "pipeline": (_is_text, "a string"),
    "status": (_is_text, "a string"),
    "reason": (_or_null(_is_text), "a string"),
    "epochs": (_or_null(_is_count), "a count (an integer >= 0)"),
    "episodes": (_or_null(_is_count), "a count (an integer >= 0)"),
    "wall_time_seconds": (_or_null(_is_number), "a number"),
    "seed": (_or_null(lambda v: isinstance(v, int) and not isinstance(v, bool)), "an integer"),
    "device": (_or_null(_is_text), "a string"),
}
_MONITOR: dict[str, tuple[Callable[[Any], bool], str]] = {
    "name": (_or_null(_is_text), "a string"),
    "mode": (_or_null(_is_text), "a string"),
    "best": (_or_null(_is_number), "a number"),
    "best_epoch": (_or_null(_is_count), "a count (an integer >= 0)"),
}


def _wrong(field: str, value: Any, expected: str) -> str:
    shown = json.dumps(value, default=str)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"summary.json: '{field}' must be {expected}, not {shown}"


def _numbers_problems(field: str, value: Any) -> list[str]:
    """An object of statistic name -> number (or null)."""
    if not isinstance(value, dict):
        return [_wrong(field, value, "an object of statistics")]
    return [
        _wrong(f"{field}.{name}", number, "a number")
        for name, number in value.items()
        if not _or_null(_is_number)(number)
    ]


def summary_problems(summary: dict[str, Any]) -> list[str]:
    """What is wrong with the types of a summary.json's fields ([] when nothing is)."""
    problems = [
        _wrong(field, summary[field], expected)
        for field, (check, expected) in _FIELDS.items()
        if field in summary and not check(summary[field])
    ]
    monitor = summary.get("monitor")
    if isinstance(monitor, dict):
        problems += [
            _wrong(f"monitor.{key}", monitor[key], expected)
            for key, (check, expected) in _MONITOR.items()
            if key in monitor and not check(monitor[key])
        ]
    elif monitor is not None:
        problems.append(_wrong("monitor", monitor, "an object"))
    if summary.get("best") is not None:
        problems += _numbers_problems("best", summary["best"])
    final = summary.get("final")
    if isinstance(final, dict):
        for section, values in final.items():
            problems += _numbers_problems(f"final.{section}", values)
    elif final is not None:
        problems.append(_wrong("final", final, "an object of sections"))
    return problems
