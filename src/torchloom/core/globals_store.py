"""Globals: values one component publishes at build time for others (`num_classes`, vocabularies).

Write-once: publishing the same value again is fine (the training and validation tasks both
publish `num_classes`), publishing a different value is an error naming both publishers.
Build order is derived from who needs what (see `pipeline_builder`), so a config never has to
declare publishers before readers.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass
from typing import Any

import torch

from torchloom.errors import ComponentError, did_you_mean


@dataclass(frozen=True)
class GlobalValue:
    value: Any
    publisher: str  # e.g. "training.task (MNIST)"


def _short(value: Any) -> str:
    """A value for a message: a vocabulary of 30,000 words is shown by its first few."""
    return reprlib.repr(value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    try:
        return bool(a == b)
    except Exception:  # values whose == is ambiguous or raises are not the same value
        return a is b


class GlobalsStore:
    """The build-time key-value store shared by all components of a pipeline."""

    def __init__(self) -> None:
        self._values: dict[str, GlobalValue] = {}

    def publish(self, name: str, value: Any, publisher: str, where: str = "") -> None:
        known = self._values.get(name)
        if known is not None and not _same(known.value, value):
            raise ComponentError.at(
                where,
                f"global '{name}'",
                f"published as {_short(value)} by {publisher}, but already as "
                f"{_short(known.value)} by {known.publisher}; globals are write-once",
                "rename one of them with a `globals:` mapping in its config",
            )
        if known is None:
            self._values[name] = GlobalValue(value, publisher)

    def get(self, name: str, requester: str, where: str = "") -> Any:
        if name not in self._values:
            raise ComponentError.at(
                where,
                f"global '{name}'",
                f"needed by {requester} but not published by any component",
                did_you_mean(name, self._values),
            )
        return self._values[name].value

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def items(self) -> list[tuple[str, GlobalValue]]:
        return sorted(self._values.items())
