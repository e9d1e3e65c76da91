"""The Relation Network of Santoro et al. 2017: a question-conditioned MLP over every pair of
objects, summed, then a classifier head.

    predictions = log_softmax(f_phi(sum over i, j of g_theta([o_i, o_j, q])))

The objects o_i are the cells of a CNN feature map, each with its (x, y) position appended.

Computing the first layer of g_theta cheaply: it is linear in the concatenation, so
W [o_i; o_j; q] + b = (W_i o_i) + (W_j o_j) + (W_q q + b), with W = [W_i | W_j | W_q]. The
three products are taken once per object (and once per question) and only their sums are
formed per pair. With N objects of width D and a first layer of width h, that is
O(N * D * h) multiply-adds instead of O(N^2 * (2D + Q) * h), and the [batch, N^2, 2D + Q]
tensor of concatenated pairs is never built. The result is the same function (the same
weights, as one `nn.Linear`), only cheaper: a 5x5 map has 625 pairs but 25 objects.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, PositiveInt
from torch import nn

from torchloom.core.component import Batch, BuildContext, ComponentParams, Model
from torchloom.core.streams import FLOATING, Dim, StreamSpec


class RelationalNetworkParams(ComponentParams):
    g_sizes: list[PositiveInt] = Field(
        default_factory=lambda: [256, 256, 256, 256],
        min_length=1,
        description="Widths of g_theta's layers (each linear + ReLU), applied to every "
        "object pair with the question; the paper: four of 256.",
    )
    f_sizes: list[PositiveInt] = Field(
        default_factory=lambda: [256, 256],
        description="Widths of f_phi's hidden layers (linear + ReLU) on the summed pair "
        "outputs, before the output layer; the paper: 256, 256.",
    )
    dropout: float = Field(
        0.5,
        ge=0.0,
        lt=1.0,
        description="Dropout before f_phi's output layer (the paper's 0.5).",
    )
    coordinates: bool = Field(
        True,
        description="Append every cell's (x, y) position, in [-1, 1], to its features.",
    )
    pair_distances: bool = Field(
        False,
        description="Also give g_theta the distance between the two cells of every pair (in "
        "the coordinates' units): g forms differences of coordinates linearly but not a "
        "distance. On Sort-of-CLEVR object descriptions, the closest/furthest questions reach "
        "0.94/0.97 after 6,000 steps with it, 0.69/0.78 without "
        "(benchmarks/sort_of_clevr_state_rn.py). Not in the paper.",
    )
    feature_normalization: bool = Field(
        False,
        description="Batch-normalise every feature map (over the batch and the cells) before "
        "making objects of the cells, so the features are on the coordinates' scale: set this "
        "when the encoder does not end with batch norm (the reference CNN does, as does "
        "ConvNetEncoder with `batch_norm: true`).",
    )
    aggregation: Literal["sum", "mean"] = Field(
        "sum",
        description="How g_theta's outputs over the pairs are combined: the paper's sum, or "
        "the mean (the same function up to a constant factor, but with Adam it learns far more "
        "slowly: f_phi's weights must grow by the number of pairs).",
    )


class RelationalNetwork(Model):
    """A Relation Network (Santoro et al. 2017) over the cells of a CNN feature map,
    conditioned on a question vector.

    Every cell of `feature_maps` [batch, depth, height, width] is an object: its `depth`
    features (batch-normalised first with `feature_normalization`) plus, with
    `coordinates`, its (x, y) position in [-1, 1]. g_theta (an MLP of
    `g_sizes`, ReLU after every layer) reads every ordered pair of objects (o_i, o_j), the
    pairs of an object with itself included as in the paper, concatenated with the question
    (and, with `pair_distances`, the distance between the two cells' positions);
    its outputs are summed (or averaged) over the pairs, and f_phi (`f_sizes`, ReLU, dropout,
    then a linear layer) turns the result into log-probabilities over `prediction_size`
    answers. g_theta's first layer is evaluated per object and added pairwise (see the module
    docstring): the same function as on concatenated pairs, at a fraction of the cost.

    Streams: reads `feature_maps` (float [batch, depth, height, width], e.g. a
    ConvNetEncoder's output) and `questions` (float [batch, question_size]); writes
    `predictions` (log-probabilities [batch, classes]). Needs the globals
    `feature_map_depth`/`_height`/`_width` (which ConvNetEncoder publishes), `question_size`
    and `prediction_size`.

    ```yaml
    pipeline:
      image_encoder:
        type: ConvNetEncoder
        layers: [{out_channels: 24, stride: 2, padding: 1, pool: 1}]
        streams: {inputs: images}
      relational_network:
        type: RelationalNetwork
        g_sizes: [256, 256, 256, 256]
        f_sizes: [256, 256]
        globals: {prediction_size: num_classes}
    ```
    """

    Params = RelationalNetworkParams
    params: RelationalNetworkParams
    positions: torch.Tensor
    distances: torch.Tensor
    EXAMPLE_GLOBALS = {
        "feature_map_depth": 24,
        "feature_map_height": 5,
        "feature_map_width": 5,
        "question_size": 11,
        "prediction_size": 10,
    }
    NEEDS_GLOBALS = {
        "feature_map_depth": "number of feature maps (features per object)",
        "feature_map_height": "height of the feature maps",
        "feature_map_width": "width of the feature maps",
        "question_size": "length of the question vectors",
        "prediction_size": "number of outputs, usually the number of answers",
    }

    def __init__(self, params: RelationalNetworkParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.depth = int(self.global_value("feature_map_depth"))
        self.height = int(self.global_value("feature_map_height"))
        self.width = int(self.global_value("feature_map_width"))
        self.question_size = int(self.global_value("question_size"))
        self.prediction_size = int(self.global_value("prediction_size"))
        self.object_size = self.depth + (2 if params.coordinates else 0)

        self.normalization = (
            nn.BatchNorm2d(self.depth) if params.feature_normalization else nn.Identity()
        )
        # g_theta's first layer over [o_i, o_j, q] (then d_ij with pair_distances), applied in
        # pieces by `relations`.
        pair_inputs = 2 * self.object_size + self.question_size + int(params.pair_distances)
        self.g_first = nn.Linear(pair_inputs, params.g_sizes[0])
        rest: list[nn.Module] = []
        for width_in, width_out in zip(params.g_sizes, params.g_sizes[1:], strict=False):
            rest += [nn.Linear(width_in, width_out), nn.ReLU()]
        self.g_rest = nn.Sequential(*rest)

        head: list[nn.Module] = []
        width = params.g_sizes[-1]
        for hidden in params.f_sizes:
            head += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        if params.dropout > 0:
            head.append(nn.Dropout(params.dropout))
        head.append(nn.Linear(width, self.prediction_size))
        self.f_phi = nn.Sequential(*head)

        # Cell positions, x then y, row-major like the flattened map; a buffer, so it follows
        # the model to its device (not saved: it is a function of the map size).
        ys = torch.linspace(-1.0, 1.0, self.height) if self.height > 1 else torch.zeros(1)
        xs = torch.linspace(-1.0, 1.0, self.width) if self.width > 1 else torch.zeros(1)
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
        positions = torch.stack([grid_x, grid_y], dim=-1).reshape(-1, 2)
        self.register_buffer("positions", positions, persistent=False)
        self.register_buffer("distances", torch.cdist(positions, positions), persistent=False)

    def input_specs(self) -> dict[str, StreamSpec]:
        maps = ("batch", self.depth, self.height, self.width)
        return {
            "feature_maps": StreamSpec(maps, FLOATING, "feature maps: one object per cell"),
            "questions": StreamSpec(("batch", self.question_size), FLOATING, "question vectors"),
        }

    def output_specs(self) -> dict[str, StreamSpec]:
        classes = Dim("classes", self.prediction_size)
        return {"predictions": StreamSpec(("batch", classes), FLOATING, "log-probabilities")}

    def objects(self, feature_maps: torch.Tensor) -> torch.Tensor:
        """The objects [batch, height * width, object_size]: cells, with their positions."""
        batch = feature_maps.shape[0]
        cells = self.normalization(feature_maps).flatten(2).transpose(1, 2)  # [batch, cells, depth]
        if not self.params.coordinates:
            return cells
        positions = self.positions.to(cells.dtype).expand(batch, -1, -1)
        return torch.cat([cells, positions], dim=2)

    def relations(self, objects: torch.Tensor, questions: torch.Tensor) -> torch.Tensor:
        """g_theta of every ordered pair (i, j): [batch, objects, objects, g_sizes[-1]], where
        [b, i, j] is g_theta([o_i, o_j, q]) of sample b."""
        size = self.object_size
        weight, bias = self.g_first.weight, self.g_first.bias
        first = objects @ weight[:, :size].T  # W_i o_i for every object: [batch, N, h]
        second = objects @ weight[:, size : 2 * size].T  # W_j o_j
        question_end = 2 * size + self.question_size
        question = questions @ weight[:, 2 * size : question_end].T + bias  # [batch, h]
        hidden = first[:, :, None, :] + second[:, None, :, :] + question[:, None, None, :]
        if self.params.pair_distances:  # d_ij times its weight column: [N, N, h], every sample
            distances = self.distances.to(hidden.dtype)
            hidden = hidden + distances[:, :, None] * weight[:, question_end]
        return self.g_rest(torch.relu(hidden))

    def forward(self, inputs: Batch) -> Batch:
        relations = self.relations(self.objects(inputs["feature_maps"]), inputs["questions"])
        pooled = relations.sum(dim=(1, 2))
        if self.params.aggregation == "mean":
            pooled = pooled / (relations.shape[1] * relations.shape[2])
        return {"predictions": torch.log_softmax(self.f_phi(pooled), dim=1)}
