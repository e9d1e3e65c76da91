"""Derived targets: a second, coarser labelling of a task's classes, for a second head."""

from __future__ import annotations

import torch
from pydantic import Field, NonNegativeInt

from torchloom.core.component import Batch, BuildContext, Component, ComponentParams
from torchloom.core.streams import StreamSpec
from torchloom.errors import ComponentError, Problem


class TargetMappingParams(ComponentParams):
    mapping: list[NonNegativeInt] = Field(
        ...,
        min_length=1,
        description="The new class of every class of the task, in class order: e.g. digit "
        "parity is [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]. The new classes must be 0 to n-1, each used.",
    )
    ignore_index: int = Field(
        -100, description="Target value passed through unchanged (the losses' ignore index)."
    )


class TargetMapping(Component):
    """Maps every class index of `targets` to a new class through a table, making the labels
    of a second task from those of the first: digit parity, "digit >= 5", a coarse category
    of a fine class. Used by multi-task pipelines to give a second head its own targets.

    Reads `targets` (int64 [batch]) and writes `mapped_targets`. Needs `num_classes` to check
    that `mapping` has one entry per class, and publishes `num_mapped_classes` (the number of
    new classes) to size the second head. Targets equal to `ignore_index` stay as they are.

    ```yaml
    pipeline:
      parity:
        type: TargetMapping
        mapping: [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]
        streams: {mapped_targets: parity_targets}
        globals: {num_mapped_classes: num_parity_classes}
    ```
    """

    Params = TargetMappingParams
    params: TargetMappingParams
    EXAMPLE_GLOBALS = {"num_classes": 10}
    NEEDS_GLOBALS = {"num_classes": "number of classes of the targets"}
    PUBLISHES_GLOBALS = {"num_mapped_classes": "number of classes after the mapping"}
    table: torch.Tensor

    def __init__(self, params: TargetMappingParams, context: BuildContext) -> None:
        super().__init__(params, context)
        classes = int(self.global_value("num_classes"))
        mapping = params.mapping
        if len(mapping) != classes:
            raise self._error(
                f"has {len(mapping)} entries but the targets have {classes} classes",
                "give the new class of every class, in class order",
            )
        unused = sorted(set(range(max(mapping) + 1)) - set(mapping))
        if unused:
            raise self._error(
                f"never maps to class {unused[0]}: the new classes must be 0 to "
                f"{max(mapping)}, each used (a head would have an output it never learns)",
                "number the new classes consecutively from 0",
            )
        self.mapped_classes = max(mapping) + 1
        # Derived from the params, so not part of checkpoints.
        self.register_buffer("table", torch.tensor(mapping, dtype=torch.int64), persistent=False)
        self.publish_global("num_mapped_classes", self.mapped_classes)

    def _error(self, message: str, suggestion: str) -> ComponentError:
        return ComponentError([Problem(self.where("mapping"), self.label, message, suggestion)])

    def input_specs(self) -> dict[str, StreamSpec]:
        return {"targets": StreamSpec(("batch",), torch.int64, "class index per sample")}

    def output_specs(self) -> dict[str, StreamSpec]:
        return {"mapped_targets": StreamSpec(("batch",), torch.int64, "new class index per sample")}

    def forward(self, inputs: Batch) -> Batch:
        targets = inputs["targets"]
        ignored = targets == self.params.ignore_index
        mapped = self.table[targets.masked_fill(ignored, 0)]
        return {"mapped_targets": mapped.masked_fill(ignored, self.params.ignore_index)}
