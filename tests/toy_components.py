"""Tiny components for core tests: a task, a linear model, losses, stream shufflers."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field

from torchloom.core.component import (
    Batch,
    BuildContext,
    Component,
    ComponentParams,
    Loss,
    Model,
    Task,
)
from torchloom.core.streams import FLOATING, Dim, StreamSpec


class ToyTask(Task):
    """Random vectors with class targets."""

    class Params(ComponentParams):
        size: int = Field(12, gt=0)
        width: int = Field(4, gt=0)
        classes: int = Field(3, gt=1)
        target_dtype: str = "int64"
        indices: bool = False  # a sample-id stream (the analysis' worst samples need one)

    PUBLISHES_GLOBALS = {"num_classes": "classes", "input_size": "vector width"}

    def __init__(self, params: Any, context: BuildContext) -> None:
        super().__init__(params, context)
        self.publish_global("num_classes", params.classes)
        self.publish_global("input_size", params.width)
        generator = torch.Generator().manual_seed(0)
        self.inputs = torch.randn(params.size, params.width, generator=generator)
        self.targets = torch.randint(0, params.classes, (params.size,), generator=generator).to(
            getattr(torch, params.target_dtype)
        )

    def dimension_sizes(self) -> dict[str, int]:
        return {"classes": self.params.classes}

    def output_specs(self) -> dict[str, StreamSpec]:
        specs = {
            "inputs": StreamSpec(("batch", self.params.width), torch.float32, "vectors"),
            "targets": StreamSpec(("batch",), getattr(torch, self.params.target_dtype), "class"),
            "labels": StreamSpec(("batch",), str, "class names"),
        }
        if self.params.indices:
            specs["indices"] = StreamSpec(("batch",), torch.int64, "sample ids")
        return specs

    def __len__(self) -> int:
        return self.params.size

    def __getitem__(self, index: int) -> Batch:
        sample = {
            "inputs": self.inputs[index],
            "targets": self.targets[index],
            "labels": str(int(self.targets[index])),
        }
        if self.params.indices:
            sample["indices"] = index
        return sample


class ToyLinear(Model):
    """A linear classifier with log-softmax output."""

    class Params(ComponentParams):
        bias: bool = True
        dropout: float = Field(0.5, ge=0, lt=1)

    NEEDS_GLOBALS = {"input_size": "input width", "prediction_size": "classes"}
    EXAMPLE_GLOBALS = {"input_size": 4, "prediction_size": 3}

    def __init__(self, params: Any, context: BuildContext) -> None:
        super().__init__(params, context)
        self.width = self.global_value("input_size")
        self.classes = self.global_value("prediction_size")
        self.linear = torch.nn.Linear(self.width, self.classes, bias=params.bias)
        self.dropout = torch.nn.Dropout(params.dropout)

    def input_specs(self) -> dict[str, StreamSpec]:
        return {"inputs": StreamSpec(("batch", self.width), FLOATING, "vectors")}

    def output_specs(self) -> dict[str, StreamSpec]:
        return {
            "predictions": StreamSpec(
                ("batch", Dim("classes", self.classes)), FLOATING, "log-probabilities"
            )
        }

    def forward(self, inputs: Batch) -> Batch:
        return {"predictions": F.log_softmax(self.dropout(self.linear(inputs["inputs"])), -1)}


class ToyLoss(Loss):
    """Negative log-likelihood."""

    def input_specs(self) -> dict[str, StreamSpec]:
        return {
            "predictions": StreamSpec(("batch", "classes"), FLOATING, "log-probs"),
            "targets": StreamSpec(("batch",), torch.int64, "targets"),
        }

    def forward(self, inputs: Batch) -> Batch:
        return {"loss": F.nll_loss(inputs["predictions"], inputs["targets"])}


class ToySquaredError(Loss):
    """A regression loss: the squared error of each sample's mean score against a float
    target (ToyTask with `target_dtype: float32`). Nothing in a pipeline with it reads class
    scores against class targets."""

    def input_specs(self) -> dict[str, StreamSpec]:
        return {
            "predictions": StreamSpec(("batch", -1), FLOATING, "scores"),
            "targets": StreamSpec(("batch",), torch.float32, "a number per sample"),
        }

    def forward(self, inputs: Batch) -> Batch:
        return {"loss": F.mse_loss(inputs["predictions"].mean(1), inputs["targets"])}


class Echo(Component):
    """Copies stream `x` to stream `y`."""

    def input_specs(self) -> dict[str, StreamSpec]:
        return {"x": StreamSpec(None, None, "anything")}

    def output_specs(self) -> dict[str, StreamSpec]:
        return {"y": StreamSpec(None, None, "the same")}

    def forward(self, inputs: Batch) -> Batch:
        return {"y": inputs["x"]}


class GlobalReader(Component):
    """Needs `value` at build time and republishes it doubled as `doubled`."""

    NEEDS_GLOBALS = {"value": "a number"}
    PUBLISHES_GLOBALS = {"doubled": "twice the number"}

    def __init__(self, params: Any, context: BuildContext) -> None:
        super().__init__(params, context)
        self.publish_global("doubled", 2 * self.global_value("value"))

    def forward(self, inputs: Batch) -> Batch:
        return {}  # it has no streams: its work is done at build time


class GlobalWriter(Component):
    """Publishes `value`."""

    class Params(ComponentParams):
        value: int = 7

    PUBLISHES_GLOBALS = {"value": "a number"}

    def __init__(self, params: Any, context: BuildContext) -> None:
        super().__init__(params, context)
        self.publish_global("value", params.value)

    def forward(self, inputs: Batch) -> Batch:
        return {}  # it has no streams: its work is done at build time


class NotAComponent:
    """A plain class: must never be built from a config."""

    built = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        NotAComponent.built = True


class LabelCounter(Component):
    """Counts the training task's `labels` at build time (as a vocabulary is built), publishes
    how many distinct labels it saw, and leaves the counts as a run artifact."""

    PUBLISHES_GLOBALS = {"distinct_labels": "labels seen in the training data"}

    def __init__(self, params: Any, context: BuildContext) -> None:
        super().__init__(params, context)
        task = self.training_task()
        self.counts: dict[str, int] = {}
        for label in task.texts("labels") if task is not None else ():
            self.counts[label] = self.counts.get(label, 0) + 1
        self.publish_global("distinct_labels", len(self.counts))

    def forward(self, inputs: Batch) -> Batch:
        return {}  # reads and writes no stream: all its work is done at build time

    def artifacts(self) -> dict[str, str]:
        return {"counts.txt": "".join(f"{k} {v}\n" for k, v in sorted(self.counts.items()))}
