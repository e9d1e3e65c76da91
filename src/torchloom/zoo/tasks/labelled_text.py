"""What every task of (text, class) samples shares: `LabelledTextTask` (streams, class
globals, collate, `texts`) and `SplitParams` (the reproducible train/validation/test split and
the text encodings), used by `TextClassification` and `LanguageIdentification`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from pydantic import Field, PositiveInt, field_validator, model_validator

from torchloom.core.component import Batch, ComponentParams, Task
from torchloom.core.streams import StreamSpec
from torchloom.data.text_sources import SplitName, check_encoding, collate_text_samples
from torchloom.errors import ComponentError, Problem

CLASS_GLOBALS = {
    "num_classes": "number of classes",
    "label_word_mappings": "class name -> class index",
}


class LabelledTextTask(Task):
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


class SplitParams(ComponentParams):
    """The split parameters of tasks that draw their own splits from one collection."""

    split: SplitName = Field(
        "train",
        description="Which part to use: validation and test are drawn from every class at "
        "random with split_seed, train is the rest.",
    )
    validation_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="Share of every class in the validation split."
    )
    test_fraction: float = Field(
        0.2, ge=0.0, lt=1.0, description="Share of every class in the test split."
    )
    split_seed: int = Field(
        0,
        description="Seed of the split's draw and order; keep it equal in the tasks of one "
        "dataset so that their splits do not overlap.",
    )
    subset: PositiveInt | None = Field(
        None,
        description="Use only the first N samples of the split (which is in a seeded order "
        "mixing the classes): quick runs and tests.",
    )
    encoding: str = Field("utf-8", description="Text encoding of the files (strict).")
    fallback_encoding: str | None = Field(
        None,
        description="Encoding to decode a file with when it is not valid `encoding`, e.g. "
        "latin-1 for corpora that mix both (BBC News); default: such a file is an error.",
    )

    @field_validator("encoding", "fallback_encoding")
    @classmethod
    def _known_codec(cls, value: str | None) -> str | None:
        return None if value is None else check_encoding(value)

    @model_validator(mode="after")
    def _fractions_leave_training_samples(self) -> SplitParams:
        if self.validation_fraction + self.test_fraction >= 1.0:
            raise ValueError("validation_fraction + test_fraction must be below 1")
        return self
