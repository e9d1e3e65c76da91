"""What every task of (text, class) samples shares: `LabelledTextTask` (streams, class
globals, collate, `texts`) and `SplitParams` (the reproducible train/validation/test split and
the text encodings), used by `TextClassification` and `LanguageIdentification`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from pydantic import Field

from torchloom.core.component import Batch
from torchloom.core.streams import StreamSpec
from torchloom.data.text_sources import collate_text_samples
from torchloom.errors import ComponentError, Problem
from torchloom.zoo.tasks.drawn_split import (
    DrawnSplitParams,
    DrawnSplitTask,
    FallbackEncodingParams,
)

CLASS_GLOBALS = {
    "num_classes": "number of classes",
    "label_word_mappings": "class name -> class index",
}


class LabelledTextTask(DrawnSplitTask):
    """Base of the tasks whose samples are a text and its class; not a component of its own.

    A subclass calls `_setup_classes` from `__init__` (reading no data unless it must list
    the classes) and implements `_load`, which returns the split's texts and class indices.
    """

    PUBLISHES_GLOBALS = CLASS_GLOBALS
    TEXTS_DESCRIPTION = "texts"

    def _setup_classes(self, class_names: Sequence[str]) -> None:
        self.class_names = list(class_names)
        self._texts: list[str] = []
        self._targets: list[int] = []
        self._loaded = False
        self.publish_global("num_classes", len(self.class_names))
        self.publish_global(
            "label_word_mappings", {name: index for index, name in enumerate(self.class_names)}
        )

    def _param_error(self, key: str, message: str, suggestion: str = "") -> ComponentError:
        return ComponentError([Problem(self.where(key), self.label, message, suggestion)])

    # ---- streams ----------------------------------------------------------------------------
    def output_specs(self) -> dict[str, StreamSpec]:
        return {
            "indices": StreamSpec(("batch",), torch.int64, "position of each sample in the split"),
            "inputs": StreamSpec(("batch",), str, self.TEXTS_DESCRIPTION),
            "targets": StreamSpec(("batch",), torch.int64, "class index"),
            "labels": StreamSpec(("batch",), str, "class name"),
        }

    def dimension_sizes(self) -> dict[str, int]:
        return {"classes": len(self.class_names)}

    # ---- data -------------------------------------------------------------------------------
    def _load(self) -> tuple[list[str], list[int]]:
        raise NotImplementedError

    def prepare(self) -> None:
        if self._loaded:
            return
        texts, targets = self._load()
        subset = getattr(self.params, "subset", None)
        if subset is not None:  # the split is in a seeded mixed order: a prefix mixes classes
            texts, targets = texts[:subset], targets[:subset]
        self._texts, self._targets = texts, targets
        self._loaded = True

    def sample_targets(self) -> torch.Tensor:
        self.prepare()
        return torch.tensor(self._targets, dtype=torch.int64)

    def __len__(self) -> int:
        self.prepare()
        return len(self._targets)

    def __getitem__(self, index: int) -> Batch:
        self.prepare()
        index = self.checked_index(index, len(self._targets))
        target = self._targets[index]
        return {
            "indices": index,
            "inputs": self._texts[index],
            "targets": target,
            "labels": self.class_names[target],
        }

    def collate(self, samples: list[Batch]) -> Batch:
        return collate_text_samples(samples)

    def texts(self, stream: str) -> Iterator[Any]:
        """One stream of every sample, straight from the loaded lists (no sample dicts)."""
        self.prepare()
        if stream == "inputs":
            yield from self._texts
        elif stream == "labels":
            yield from (self.class_names[target] for target in self._targets)
        elif stream == "targets":
            yield from self._targets
        elif stream == "indices":
            yield from range(len(self._targets))
        else:
            raise KeyError(f"{self.label} has no stream '{stream}'")


class SplitParams(DrawnSplitParams, FallbackEncodingParams):
    """The split and encoding parameters of the (text, class) tasks: a fifth of every class
    for test by default."""

    validation_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="Share of every class in the validation split."
    )
    test_fraction: float = Field(
        0.2, ge=0.0, lt=1.0, description="Share of every class in the test split."
    )
