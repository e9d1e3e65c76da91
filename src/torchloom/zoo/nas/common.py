"""What the searchable and the fixed DARTS networks share: their parameters, the geometry of
the stack of cells (where it reduces, how many maps each cell gets) and the stream specs."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import Field
from torch import nn

from torchloom.core.component import Batch, BuildContext, ComponentParams, Model
from torchloom.core.streams import FLOATING, Dim, StreamSpec
from torchloom.errors import ComponentError
from torchloom.zoo.models.image_inputs import (
    CLASSES_GLOBAL,
    IMAGE_EXAMPLE,
    IMAGE_GLOBALS,
    image_size,
)
from torchloom.zoo.nas.genotype import (
    MAX_CELLS,
    MAX_CHANNELS,
    reduction_positions,
    reduction_problem,
)


class DartsParams(ComponentParams):
    cells: int = Field(
        8,
        ge=1,
        le=MAX_CELLS,
        description="cells in the stack (the paper: 8 searching, 20 after)",
    )
    channels: int = Field(
        16,
        ge=2,
        le=MAX_CHANNELS,
        description="maps per node in the first cells; doubled at every reduction",
    )
    reductions: int = Field(
        2,
        ge=0,
        description="reduction cells (stride 2, doubled maps), evenly spaced: at 1/3 and 2/3 "
        "of the depth for 2",
    )
    stem_multiplier: int = Field(
        3, ge=1, le=16, description="the stem convolution has this * channels maps"
    )
    log_softmax: bool = Field(
        False,
        description="end with log_softmax (for NLLLoss); false gives raw logits (CrossEntropyLoss)",
    )


@dataclass(frozen=True)
class CellPlan:
    """One cell of the stack: its input and output sizes."""

    c_previous_previous: int
    c_previous: int
    channels: int  # maps per node
    reduction: bool
    reduction_previous: bool


def plan_cells(params: DartsParams, multiplier: int) -> list[CellPlan]:
    """Maps per cell, as in DARTS: each cell reads the outputs of the two before it (the stem
    for the first), and outputs `multiplier` nodes of `channels` maps."""
    positions = set(reduction_positions(params.cells, params.reductions))
    stem = params.stem_multiplier * params.channels
    c_pp, c_p, channels = stem, stem, params.channels
    plans, reduction_previous = [], False
    for index in range(params.cells):
        reduction = index in positions
        if reduction:
            channels *= 2
        plans.append(CellPlan(c_pp, c_p, channels, reduction, reduction_previous))
        c_pp, c_p, reduction_previous = c_p, multiplier * channels, reduction
    return plans


class DartsBase(Model):
    """Stem -> cells -> global average pooling -> linear classifier, over images."""

    params: DartsParams
    EXAMPLE_GLOBALS = {**IMAGE_EXAMPLE, "prediction_size": 10}
    NEEDS_GLOBALS = {**IMAGE_GLOBALS, **CLASSES_GLOBAL}

    def __init__(self, params: DartsParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.input_depth, self.input_height, self.input_width = image_size(self)
        self.prediction_size = int(self.global_value("prediction_size"))
        problem = reduction_problem(
            params.cells, params.reductions, self.where("reductions"), self.label
        )
        if problem is not None:
            raise ComponentError([problem])
        height, width = self.input_height, self.input_width
        for reduction in range(params.reductions):
            if height % 2 or width % 2:
                raise ComponentError.at(
                    self.where("globals"),
                    self.label,
                    f"receives {self.input_height}x{self.input_width} images, which reduction "
                    f"cell {reduction + 1} of {params.reductions} would halve from an odd size "
                    f"({height}x{width})",
                    "resize the images (e.g. to 32x32) or use fewer `reductions`",
                )
            height, width = height // 2, width // 2
        self.final_size = (height, width)
        stem = params.stem_multiplier * params.channels
        self.stem = nn.Sequential(
            nn.Conv2d(self.input_depth, stem, 3, padding=1, bias=False), nn.BatchNorm2d(stem)
        )

    def classifier_head(self, features: int) -> None:
        self.global_pooling = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(features, self.prediction_size)

    def classify(self, features: torch.Tensor) -> torch.Tensor:
        logits = self.classifier(self.global_pooling(features).flatten(1))
        return torch.log_softmax(logits, dim=1) if self.params.log_softmax else logits

    def input_specs(self) -> dict[str, StreamSpec]:
        dims = ("batch", self.input_depth, self.input_height, self.input_width)
        return {"inputs": StreamSpec(dims, FLOATING, "images")}

    def output_specs(self) -> dict[str, StreamSpec]:
        kind = "log-probabilities" if self.params.log_softmax else "logits"
        return {
            "predictions": StreamSpec(
                ("batch", Dim("classes", self.prediction_size)), FLOATING, f"class {kind}"
            )
        }

    def forward(self, inputs: Batch) -> Batch:
        raise NotImplementedError
