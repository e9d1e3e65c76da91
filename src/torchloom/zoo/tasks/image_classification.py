"""What every image-classification task shares: streams, globals, transforms, indexing.

A subclass says what its images are (depth, size, class names, the normalisation its
`normalize` switch applies) by calling `_setup_images` from `__init__`, which reads no data,
and loads them in `_load` (called once by `prepare`) as either a uint8 tensor
[count, depth, height, width] or a list of files read per sample by `_read_image`. Samples are
dicts of the default stream names `indices`, `inputs`, `targets` and `labels`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchloom.core.component import Batch, Task
from torchloom.core.streams import StreamSpec
from torchloom.errors import ComponentError, DataError, Problem
from torchloom.zoo.image_transforms import (
    ImagePipeline,
    ImageTransforms,
    Normalization,
    build_image_pipeline,
)

IMAGE_GLOBALS = {
    "input_depth": "number of channels of the images",
    "input_height": "image height in pixels, after the transforms",
    "input_width": "image width in pixels, after the transforms",
    "num_classes": "number of classes",
    "label_word_mappings": "class name -> class index",
}


class ImageClassificationTask(Task):
    """Base of the image-classification tasks; not a component of its own."""

    PUBLISHES_GLOBALS = IMAGE_GLOBALS
    IMAGES_DESCRIPTION = "images"

    def _setup_images(
        self,
        depth: int,
        height: int,
        width: int,
        class_names: Sequence[str],
        transforms: ImageTransforms,
        normalization: Normalization | None,
    ) -> None:
        """Check the transforms, then publish the globals; call from `__init__`."""
        self.pipeline: ImagePipeline = build_image_pipeline(
            transforms,
            depth,
            height,
            width,
            normalization,
            subject=self.label,
            where=self._context.where("transforms"),
        )
        self.class_names = list(class_names)
        self.normalized = transforms.normalize is not None or normalization is not None
        # Filled by prepare(); building the task must not touch the disk.
        self._images: torch.Tensor | None = None
        self._targets: list[int] = []
        self._loaded = False
        self.publish_global("input_depth", depth)
        self.publish_global("input_height", self.pipeline.height)
        self.publish_global("input_width", self.pipeline.width)
        self.publish_global("num_classes", len(self.class_names))
        self.publish_global(
            "label_word_mappings", {name: index for index, name in enumerate(self.class_names)}
        )

    def _param_error(self, parameter: str, message: str, suggestion: str) -> ComponentError:
        return ComponentError(
            [Problem(self._context.where(parameter), self.label, message, suggestion)]
        )

    # ---- streams ----------------------------------------------------------------------------
    def output_specs(self) -> dict[str, StreamSpec]:
        pipeline = self.pipeline
        images = self.IMAGES_DESCRIPTION + (", standardised" if self.normalized else "")
        return {
            "indices": StreamSpec(("batch",), torch.int64, "position of each sample in the split"),
            "inputs": StreamSpec(
                ("batch", pipeline.depth, pipeline.height, pipeline.width), torch.float32, images
            ),
            "targets": StreamSpec(("batch",), torch.int64, "class index"),
            "labels": StreamSpec(("batch",), str, "class name"),
        }

    def dimension_sizes(self) -> dict[str, int]:
        return {"classes": len(self.class_names)}

    # ---- data -------------------------------------------------------------------------------
    def _load(self) -> tuple[torch.Tensor | None, list[int]]:
        """(uint8 images [count, depth, height, width] or None when `_read_image` reads each
        sample, class index per sample) of the split."""
        raise NotImplementedError

    def _read_image(self, index: int) -> torch.Tensor:
        """The uint8 image [depth, height, width] of one sample, when `_load` gave no tensor."""
        raise NotImplementedError

    def prepare(self) -> None:
        """Locate, verify and load the split, once; deterministic transforms are applied here."""
        if self._loaded:
            return
        images, targets = self._load()
        self._images = None if images is None else self.pipeline.precompute(images)
        self._targets = targets
        self._loaded = True

    def sample_targets(self) -> torch.Tensor:
        """The class of every sample of the split, for class-balanced sampling."""
        self.prepare()
        return torch.tensor(self._targets, dtype=torch.int64)

    def __len__(self) -> int:
        self.prepare()
        return len(self._targets)

    def __getitem__(self, index: int) -> Batch:
        self.prepare()
        size = len(self._targets)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError(f"index {index} out of range for {size} samples")
        image = self._images[index] if self._images is not None else self._read_image(index)
        target = self._targets[index]
        sample: dict[str, Any] = {
            "indices": index,
            "inputs": self.pipeline(image),
            "targets": target,
            "labels": self.class_names[target],
        }
        return sample


def split_range(split: str, file_size: int, validation_size: int, source: str) -> tuple[int, int]:
    """[start, stop) of a split whose validation part is the end of the training file
    (`source`, named in the error when validation_size leaves no training images); the test
    split is a file of its own, read whole."""
    if split != "test" and validation_size >= file_size:
        raise DataError(
            [
                Problem(
                    source,
                    "training images",
                    f"validation_size {validation_size} leaves no training images out of "
                    f"{file_size}",
                    f"set validation_size below {file_size}",
                )
            ]
        )
    boundary = file_size - validation_size
    if split == "train":
        return 0, boundary
    if split == "validation":
        return boundary, file_size
    return 0, file_size
