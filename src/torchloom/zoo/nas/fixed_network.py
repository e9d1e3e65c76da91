"""The discrete DARTS network built from a genotype written in YAML: what a search found,
trained from scratch (configs/nas/darts_v2_cifar10.yml carries the paper's DARTS V2 cell)."""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

from torchloom.core.component import Batch, BuildContext
from torchloom.core.streams import FLOATING, Dim, StreamSpec
from torchloom.errors import ComponentError
from torchloom.zoo.nas.common import CellPlan, DartsBase, DartsParams, plan_cells
from torchloom.zoo.nas.genotype import (
    MAX_CELLS,
    MAX_CHANNELS,
    Genotype,
    genotype_problems,
    reduction_positions,
)
from torchloom.zoo.nas.operations import ScheduledDropPath, operation, preprocessing

AUXILIARY_CHANNELS = (128, 768)


class FixedCell(nn.Module):
    """Each intermediate node sums two operations on earlier nodes, as the genotype says."""

    def __init__(self, plan: CellPlan, genotype: Genotype) -> None:
        super().__init__()
        kind = "reduce" if plan.reduction else "normal"
        self.reduction = plan.reduction
        self.preprocess_0, self.preprocess_1 = preprocessing(
            plan.c_previous_previous, plan.c_previous, plan.channels, plan.reduction_previous, True
        )
        edges = genotype.edges(kind)
        self.sources = [source for _, source in edges]
        self.concat = genotype.concat(kind)
        self.operations = nn.ModuleList(
            operation(name, plan.channels, 2 if plan.reduction and source < 2 else 1, True)
            for name, source in edges
        )

    def forward(self, s0: torch.Tensor, s1: torch.Tensor, drop: ScheduledDropPath) -> torch.Tensor:
        states = [self.preprocess_0(s0), self.preprocess_1(s1)]
        for first in range(0, len(self.operations), 2):
            node = None
            for index in (first, first + 1):
                op = self.operations[index]
                h = op(states[self.sources[index]])
                if not isinstance(op, nn.Identity):  # a skip connection is never dropped
                    h = drop.dropped(h)
                node = h if node is None else node + h
            assert node is not None
            states.append(node)
        return torch.cat([states[i] for i in self.concat], dim=1)


class AuxiliaryHead(nn.Sequential):
    """The auxiliary classifier of DARTS's CIFAR network, on the last reduction cell's output
    (an 8x8 map there, pooled 5/3 to 2x2 as in the paper; another size to the 2x2 adaptive
    pooling gives, by a plain average pool: adaptive pooling's backward has no deterministic
    version on a GPU, which `training.deterministic` refuses)."""

    def __init__(self, channels: int, size: int, classes: int) -> None:
        pool: nn.Module
        if size == 8:
            pool = nn.AvgPool2d(5, stride=3, padding=0, count_include_pad=False)
        elif size >= 2:  # windows [0, ceil(s/2)) and [floor(s/2), s): adaptive pooling's own
            pool = nn.AvgPool2d((size + 1) // 2, stride=size // 2)
        else:
            pool = nn.AdaptiveAvgPool2d(2)
        hidden, features = AUXILIARY_CHANNELS
        super().__init__(
            nn.ReLU(),
            pool,
            nn.Conv2d(channels, hidden, 1, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU(),
            nn.Conv2d(hidden, features, 2, bias=False),
            nn.BatchNorm2d(features),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(features, classes),
        )


class DartsFixedNetworkParams(DartsParams):
    cells: int = Field(
        20, ge=1, le=MAX_CELLS, description="cells in the stack (the paper: 20 for CIFAR-10)"
    )
    channels: int = Field(
        36, ge=2, le=MAX_CHANNELS, description="maps per node in the first cells (paper: 36)"
    )
    genotype: Genotype = Field(description="the cells: see docs/architecture-search.md")
    auxiliary: bool = Field(
        False,
        description="add the auxiliary classifier on the last reduction cell's output, "
        "published as `auxiliary_predictions` (weigh its loss with training.loss_weights, "
        "0.4 in the paper)",
    )
    drop_path: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="probability of dropping each operation's output per sample in training: "
        "constant, or the top of the ramp with `drop_path_epochs`",
    )
    drop_path_epochs: int | None = Field(
        None,
        ge=1,
        description="raise drop-path linearly from 0 to `drop_path` over this many epochs, "
        "`drop_path * epoch / drop_path_epochs` in epoch 0, 1, ... as the paper's train.py "
        "does over the whole training (`${training.terminal_conditions.epoch_limit}`); "
        "`drop_path` after them. Unset: constant",
    )


class DartsFixedNetwork(DartsBase):
    """A discrete DARTS network (Liu et al. 2019): stem, `cells` cells built from `genotype`
    (reduction cells at 1/3 and 2/3 of the depth), global pooling, a linear classifier; an
    optional auxiliary head and drop-path (constant, or raised linearly over the epochs).

    ```yaml
    pipeline:
      image_classifier:
        type: DartsFixedNetwork
        cells: 3
        channels: 8
        genotype:
          normal: [[sep_conv_3x3, 0], [skip_connect, 1], [sep_conv_3x3, 1], [dil_conv_3x3, 2]]
          normal_concat: [2, 3]
          reduce: [[max_pool_3x3, 0], [max_pool_3x3, 1], [skip_connect, 2], [max_pool_3x3, 1]]
          reduce_concat: [2, 3]
        globals: {prediction_size: num_classes}
    ```
    """

    Params = DartsFixedNetworkParams
    params: DartsFixedNetworkParams

    def __init__(self, params: DartsFixedNetworkParams, context: BuildContext) -> None:
        problems = genotype_problems(params.genotype, context.where, ("genotype",))
        if problems:
            raise ComponentError(problems)
        super().__init__(params, context)
        genotype = params.genotype
        if len(genotype.normal_concat) != len(genotype.reduce_concat):
            raise ComponentError.at(
                self.where("genotype", "reduce_concat"),
                self.label,
                f"concatenates {len(genotype.reduce_concat)} nodes in reduction cells but "
                f"{len(genotype.normal_concat)} in normal cells",
                "the paper's cells concatenate the same number (4) in both",
            )
        plans = plan_cells(params, len(genotype.normal_concat))
        self.cells = nn.ModuleList(FixedCell(plan, genotype) for plan in plans)
        positions = reduction_positions(params.cells, params.reductions)
        self.auxiliary_after = positions[-1] if positions else 2 * params.cells // 3
        if params.auxiliary:
            plan = plans[self.auxiliary_after]
            c_out = len(genotype.concat("reduce" if plan.reduction else "normal")) * plan.channels
            self.auxiliary_head = AuxiliaryHead(c_out, self.final_size[0], self.prediction_size)
        self.classifier_head(len(genotype.normal_concat) * plans[-1].channels)
        self.scheduled_drop_path = ScheduledDropPath(params.drop_path, params.drop_path_epochs)

    @property
    def drop_probability(self) -> float:
        return self.scheduled_drop_path.value

    def start_epoch(self, epoch: int) -> None:
        self.scheduled_drop_path.start_epoch(epoch)

    def output_specs(self) -> dict[str, StreamSpec]:
        specs = super().output_specs()
        if self.params.auxiliary:
            specs["auxiliary_predictions"] = StreamSpec(
                ("batch", Dim("classes", self.prediction_size)),
                FLOATING,
                "class logits of the auxiliary head (add a loss on them while training)",
            )
        return specs

    def weight_count(self) -> int:
        """Parameters without the auxiliary head's, as the paper counts them."""
        head = (
            sum(p.numel() for p in self.auxiliary_head.parameters()) if self.params.auxiliary else 0
        )
        return sum(p.numel() for p in self.parameters()) - head

    def forward(self, inputs: Batch) -> Batch:
        s0 = s1 = self.stem(inputs["inputs"])
        outputs: Batch = {}
        for index, cell in enumerate(self.cells):
            s0, s1 = s1, cell(s0, s1, self.scheduled_drop_path)
            if self.params.auxiliary and index == self.auxiliary_after:
                outputs["auxiliary_predictions"] = self.auxiliary_head(s1)
        outputs["predictions"] = self.classify(s1)
        return outputs
