"""Parameters of the tasks that draw their own train/validation/test splits from one collection
(texts per class, documents, sentence pairs, an image folder), and of those that read text
files: each field and check written once, the tasks override only a default or a description.
`DrawnSplitTask` is their base: it checks that every section draws its split alike.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, PositiveInt, field_validator, model_validator

from torchloom.core.component import ComponentParams, Task
from torchloom.data.text_sources import SplitName, check_encoding
from torchloom.errors import Problem


class DrawnSplitParams(ComponentParams):
    split: SplitName = Field(
        "train",
        description="Which split to use. Where the task draws them, validation and test are "
        "drawn at random with split_seed (from every class apart, where there are classes) "
        "and train is the rest.",
    )
    validation_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="Share of the collection in the validation split."
    )
    test_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="Share of the collection in the test split."
    )
    split_seed: int = Field(
        0,
        description="Seed of the split's draw and order; keep it equal in the tasks of one "
        "dataset so that their splits do not overlap.",
    )
    subset: PositiveInt | None = Field(
        None,
        description="Use only the first N samples of the split (which is in a seeded order, "
        "mixing the classes): quick runs and tests.",
    )

    @model_validator(mode="after")
    def _fractions_leave_training_samples(self) -> DrawnSplitParams:
        if self.validation_fraction + self.test_fraction >= 1.0:
            raise ValueError("validation_fraction + test_fraction must be below 1")
        return self


class TextEncodingParams(ComponentParams):
    encoding: str = Field("utf-8", description="Text encoding of the files (strict).")

    @field_validator("encoding")
    @classmethod
    def _known_codec(cls, value: str) -> str:
        return check_encoding(value)


class FallbackEncodingParams(TextEncodingParams):
    fallback_encoding: str | None = Field(
        None,
        description="Encoding to decode a file with when it is not valid `encoding`, e.g. "
        "latin-1 for corpora that mix both (BBC News); default: such a file is an error.",
    )

    @field_validator("fallback_encoding")
    @classmethod
    def _known_fallback_codec(cls, value: str | None) -> str | None:
        return None if value is None else check_encoding(value)


SPLIT_KEYS = ("validation_fraction", "test_fraction", "split_seed")
COLLECTION_KEYS = ("data_folder", "file", "format")  # which collection is split


class DrawnSplitTask(Task):
    """A task that draws its train/validation/test splits from one collection (its params are
    DrawnSplitParams): a validation or test task must draw them as the training task does.
    `SPLIT_PARAMETERS`: the task's own filters of the items (sentence lengths, prefixes),
    which decide what the split is drawn from as the fractions and seed decide the draw
    (classes are split each on its own: another list of classes splits the others alike)."""

    SPLIT_PARAMETERS: ClassVar[tuple[str, ...]] = ()

    def split_problems(self, training: Task) -> list[Problem]:
        """With another fraction, seed or filter it draws another split, which overlaps the
        training one (a `validation_fraction` set in the validation section alone made half
        its articles training ones). Tasks of another type or collection are not compared."""
        mine: Any = self.params
        theirs: Any = training.params
        if type(self) is not type(training) or not isinstance(mine, DrawnSplitParams):
            return []
        if any(getattr(mine, k, None) != getattr(theirs, k, None) for k in COLLECTION_KEYS):
            return []
        return [
            Problem(
                self.where(key),
                self.label,
                f"{key} is {getattr(mine, key)!r} where the training task's is "
                f"{getattr(theirs, key)!r}: each task draws its split from the collection as "
                "it keeps it, so the splits would overlap",
                f"give every section's task the same {key}",
            )
            for key in (*SPLIT_KEYS, *self.SPLIT_PARAMETERS)
            if getattr(mine, key) != getattr(theirs, key)
        ]
