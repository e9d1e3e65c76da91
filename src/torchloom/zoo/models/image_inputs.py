"""The globals an image model reads from its task (channels, height, width of the images),
declared once for every model that takes images."""

from __future__ import annotations

from torchloom.core.component import Component

IMAGE_GLOBALS = {
    "input_depth": "number of channels of the input images",
    "input_height": "height of the input images",
    "input_width": "width of the input images",
}
IMAGE_EXAMPLE = {"input_depth": 1, "input_height": 28, "input_width": 28}
CLASSES_GLOBAL = {"prediction_size": "number of outputs, usually the number of classes"}


def image_size(component: Component) -> tuple[int, int, int]:
    """(depth, height, width) of the images, from the component's globals."""
    depth, height, width = (int(component.global_value(name)) for name in IMAGE_GLOBALS)
    return depth, height, width
