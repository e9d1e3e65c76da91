"""GenericImageEncoder: a torchvision classification network without its classifier."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch
import torchvision
from pydantic import Field, PositiveInt
from torch import nn

from torchloom.core.component import Batch, BuildContext, ComponentParams, Model
from torchloom.core.streams import FLOATING, StreamSpec
from torchloom.core.weights import read_weights_file
from torchloom.errors import ComponentError, Problem, WeightsError

ModelType = Literal["vgg16", "resnet18", "resnet50", "resnet152", "densenet121"]
# Smallest images each network's pooling leaves at least one pixel of (found by dry runs).
MINIMUM_SIZE = {"vgg16": 32, "resnet18": 1, "resnet50": 1, "resnet152": 1, "densenet121": 29}


class GenericImageEncoderParams(ComponentParams):
    model_type: ModelType = Field(
        "resnet18", description="The torchvision network: vgg16, resnet18/50/152, densenet121."
    )
    output: Literal["vector", "feature_maps"] = Field(
        "vector",
        description="vector: the feature maps averaged over height and width (then projected "
        "to output_size when given); feature_maps: the last feature maps themselves.",
    )
    output_size: PositiveInt | None = Field(
        None,
        description="Size of a linear projection of the vector (output: vector only); "
        "default: no projection, the vector has one value per feature map.",
    )
    pretrained: str = Field(
        "none",
        description="none: random weights; torchvision: the weights API's DEFAULT (ImageNet) "
        "weights, downloaded once into TORCH_HOME; else the path of a state dict of the whole "
        "torchvision network (such as torchvision's own .pth files), read with "
        "torch.load(weights_only=True).",
    )
    freeze_backbone: bool = Field(
        False,
        description="Keep the network's weights (and BatchNorm statistics) fixed; only the "
        "projection, if any, trains.",
    )


def _shape_text(value: Any) -> str:
    shape = getattr(value, "shape", None)
    return str(list(shape)) if shape is not None else f"(a {type(value).__name__})"


def _backbone(network: nn.Module, model_type: str) -> nn.Sequential:
    """The convolutional part, its children named as in torchvision's network, so that the
    network's state-dict keys fit it unchanged."""
    if model_type.startswith("resnet"):
        names = ["conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4"]
        return nn.Sequential(OrderedDict((name, network.get_submodule(name)) for name in names))
    features = network.get_submodule("features")
    if model_type == "densenet121":
        # torchvision's DenseNet applies the final ReLU in forward(), after `features`.
        return nn.Sequential(OrderedDict(features=features, relu=nn.ReLU()))
    return nn.Sequential(OrderedDict(features=features))  # vgg16


class GenericImageEncoder(Model):
    """A torchvision network (vgg16, resnet18/50/152, densenet121) as an image encoder.

    The classification network without its classifier, as PyTorchPipe's GenericImageEncoder.

    `output: vector` gives one vector per image, the last feature maps averaged over height
    and width, optionally projected by a linear layer to `output_size`, and publishes its
    size as `feature_size`; `output: feature_maps` gives the maps and publishes
    `feature_map_depth`, `feature_map_height` and `feature_map_width`. The sizes come from a
    dry run on a zero image when the pipeline is built, so an image too small for the network
    is an error then. One-channel images are repeated into three. `pretrained` loads
    ImageNet weights (torchvision's weights API, which downloads them once) or a state dict
    of the whole torchvision network from a file; such weights expect images normalised with
    the ImageNet mean and std. To transplant an encoder trained by another pipeline, use the
    component's `load:` entry instead.

    ```yaml
    pipeline:
      image_encoder:
        type: GenericImageEncoder
        model_type: resnet18
        pretrained: ~/weights/resnet18-f37072fd.pth
        freeze_backbone: true
        globals: {feature_size: image_feature_size}
    ```
    """

    Params = GenericImageEncoderParams
    params: GenericImageEncoderParams
    NEEDS_GLOBALS = {
        "input_depth": "number of channels of the input images (1 or 3)",
        "input_height": "height of the input images",
        "input_width": "width of the input images",
    }
    EXAMPLE_GLOBALS = {"input_depth": 3, "input_height": 224, "input_width": 224}

    @classmethod
    def published_globals(cls, params: ComponentParams) -> Mapping[str, str]:
        assert isinstance(params, GenericImageEncoderParams)
        if params.output == "vector":
            return {"feature_size": "size of the vector per image"}
        return {
            "feature_map_depth": "number of feature maps the encoder produces",
            "feature_map_height": "height of the feature maps",
            "feature_map_width": "width of the feature maps",
        }

    def __init__(self, params: GenericImageEncoderParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.input_depth = int(self.global_value("input_depth"))
        self.input_height = int(self.global_value("input_height"))
        self.input_width = int(self.global_value("input_width"))
        if self.input_depth not in (1, 3):
            raise self._build_error(
                "globals",
                f"received images of {self.input_depth} channels, but takes 1 or 3",
                "convert the images to RGB or grey-scale",
            )
        if params.output_size is not None and params.output == "feature_maps":
            raise self._build_error(
                "output_size",
                "output_size projects the vector, but output is feature_maps",
                "remove output_size or set output: vector",
            )
        self.backbone = _backbone(self._network(), params.model_type)
        depth, height, width = self._dry_run()
        self.feature_map_depth, self.feature_map_height, self.feature_map_width = (
            depth,
            height,
            width,
        )
        self.projection = (
            nn.Linear(depth, params.output_size) if params.output_size is not None else None
        )
        self.feature_size = params.output_size or depth
        if params.output == "vector":
            self.publish_global("feature_size", self.feature_size)
        else:
            self.publish_global("feature_map_depth", depth)
            self.publish_global("feature_map_height", height)
            self.publish_global("feature_map_width", width)
        if params.freeze_backbone:
            for parameter in self.backbone.parameters():
                parameter.requires_grad_(False)
            self.backbone.eval()

    def _build_error(self, key: str, message: str, suggestion: str = "") -> ComponentError:
        return ComponentError([Problem(self._context.where(key), self.label, message, suggestion)])

    # ---- weights ----------------------------------------------------------------------------
    def _network(self) -> nn.Module:
        model_type, pretrained = self.params.model_type, self.params.pretrained
        if pretrained == "torchvision":
            try:
                return torchvision.models.get_model(model_type, weights="DEFAULT")
            except Exception as error:  # offline, a blocked proxy, a full disk: say so plainly
                raise WeightsError.at(
                    self._context.where("pretrained"),
                    self.label,
                    f"cannot get torchvision's DEFAULT weights for {model_type} (they "
                    f"are downloaded once into TORCH_HOME): {error}".splitlines()[0],
                    "download the weights file elsewhere and set pretrained to its path",
                ) from error
        network = torchvision.models.get_model(model_type, weights=None)
        if pretrained != "none":
            self._load_file(network, Path(pretrained).expanduser())
        return network

    def _load_file(self, network: nn.Module, path: Path) -> None:
        where = self._context.where("pretrained")
        state = read_weights_file(path, where, self.label)
        backbone_keys = set(_backbone(network, self.params.model_type).state_dict())
        # The classifier's weights are allowed in the file and ignored: the encoder has none.
        known_keys = set(network.state_dict())
        missing = sorted(backbone_keys - set(state))
        unexpected = sorted(str(key) for key in set(state) - known_keys)
        problems = []
        if missing:
            problems.append(
                f"lacks {len(missing)} weights of {self.params.model_type}, e.g. "
                f"{', '.join(missing[:3])}"
            )
        if unexpected:
            problems.append(
                f"has {len(unexpected)} weights {self.params.model_type} does "
                f"not have, e.g. {', '.join(unexpected[:3])}"
            )
        mismatched = [
            f"{key} {_shape_text(state[key])} instead of {list(value.shape)}"
            for key, value in network.state_dict().items()
            if key in backbone_keys
            and key in state
            and getattr(state[key], "shape", None) != value.shape
        ]
        if mismatched:
            problems.append(
                f"has {len(mismatched)} weights of other shapes, e.g. {'; '.join(mismatched[:3])}"
            )
        if problems:
            raise WeightsError.at(
                where,
                self.label,
                f"weights file '{path}' does not fit {self.params.model_type}: "
                + "; ".join(problems),
                f"give a state dict of torchvision's {self.params.model_type}",
            )
        backbone_state = {key: value for key, value in state.items() if key in backbone_keys}
        network.load_state_dict(backbone_state, strict=False)

    # ---- geometry ---------------------------------------------------------------------------
    def _dry_run(self) -> tuple[int, int, int]:
        """(depth, height, width) of the feature maps, from a zero image of the input size."""
        was_training = self.backbone.training
        self.backbone.eval()  # BatchNorm must neither fail on one image nor learn from it
        try:
            with torch.no_grad():
                maps = self.backbone(torch.zeros(1, 3, self.input_height, self.input_width))
        except RuntimeError as error:
            minimum = MINIMUM_SIZE[self.params.model_type]
            raise self._build_error(
                "globals",
                f"received images of {self.input_height}x{self.input_width} pixels, too small "
                f"for {self.params.model_type}, which needs at least {minimum}x{minimum}: "
                f"{error}".splitlines()[0],
                "resize the images (e.g. transforms: {resize: [224, 224]} in the task)",
            ) from error
        finally:
            self.backbone.train(was_training)
        _, depth, height, width = maps.shape
        return int(depth), int(height), int(width)

    def train(self, mode: bool = True) -> GenericImageEncoder:
        super().train(mode)
        if self.params.freeze_backbone:
            self.backbone.eval()  # frozen BatchNorm statistics stay as loaded
        return self

    # ---- streams ----------------------------------------------------------------------------
    def input_specs(self) -> dict[str, StreamSpec]:
        dims = ("batch", self.input_depth, self.input_height, self.input_width)
        return {"inputs": StreamSpec(dims, FLOATING, "images")}

    def output_specs(self) -> dict[str, StreamSpec]:
        if self.params.output == "vector":
            kind = "projected " if self.projection is not None else ""
            return {
                "outputs": StreamSpec(
                    ("batch", self.feature_size),
                    FLOATING,
                    f"{kind}{self.params.model_type} feature vector per image",
                )
            }
        dims = ("batch", self.feature_map_depth, self.feature_map_height, self.feature_map_width)
        return {
            "feature_maps": StreamSpec(
                dims, FLOATING, f"last feature maps of {self.params.model_type}"
            )
        }

    def forward(self, inputs: Batch) -> Batch:
        images = inputs["inputs"]
        if self.input_depth == 1:
            images = images.expand(-1, 3, -1, -1)
        maps = self.backbone(images)
        if self.params.output == "feature_maps":
            return {"feature_maps": maps}
        vectors = maps.mean(dim=(2, 3))
        if self.projection is not None:
            vectors = self.projection(vectors)
        return {"outputs": vectors}
