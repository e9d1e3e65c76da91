"""Turning class scores into decisions: the index, and optionally the label word."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from pydantic import Field

from torchloom.core.component import Batch, BuildContext, Component, ComponentParams
from torchloom.core.streams import FLOATING, StreamSpec


class ArgMaxPredictionParams(ComponentParams):
    labels: bool = Field(
        False,
        description="also publish the label word of each prediction (needs the global "
        "label_word_mappings, e.g. from the MNIST task)",
    )


class ArgMaxPrediction(Component):
    """The highest-scoring class of each sample, as an index (and a label word).

    ```yaml
    pipeline:
      decision: {type: ArgMaxPrediction, labels: true}
    ```
    """

    Params = ArgMaxPredictionParams
    params: ArgMaxPredictionParams
    EXAMPLE_GLOBALS = {"label_word_mappings": {"cat": 0, "dog": 1}}

    @classmethod
    def needed_globals(cls, params: Any) -> Mapping[str, str]:
        if params.labels:
            return {"label_word_mappings": "label word -> class index"}
        return {}

    def __init__(self, params: ArgMaxPredictionParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.words: list[str] = []
        if params.labels:
            mapping = self.global_value("label_word_mappings")
            self.words = [w for w, _ in sorted(mapping.items(), key=lambda item: item[1])]

    def input_specs(self) -> dict[str, StreamSpec]:
        return {"predictions": StreamSpec(("batch", "classes"), FLOATING, "class scores")}

    def output_specs(self) -> dict[str, StreamSpec]:
        specs = {"predicted_indices": StreamSpec(("batch",), torch.int64, "predicted class")}
        if self.params.labels:
            specs["predicted_labels"] = StreamSpec(("batch",), str, "predicted label word")
        return specs

    def forward(self, inputs: Batch) -> Batch:
        indices = inputs["predictions"].argmax(dim=-1)
        outputs: Batch = {"predicted_indices": indices}
        if self.params.labels:
            outputs["predicted_labels"] = [self.words[i] for i in indices.tolist()]
        return outputs
