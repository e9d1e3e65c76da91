"""What every image-classification task shares: streams, globals, transforms, indexing.

A subclass says what its images are (depth, size, class names, the normalisation its
`normalize` switch applies) by calling `_setup_images` from `__init__`, which reads no data,
and loads them in `_load` (called once by `prepare`) as either a uint8 tensor
[count, depth, height, width] or a list of files read per sample by `_read_image`. Samples are
dicts of the default stream names `indices`, `inputs`, `targets` and `labels`. Pixels become
floats here, by `unit_floats` (zoo/image_transforms.py), before the other steps.

Datasets published as a training and a test set (MNIST-like IDX files, CIFAR) share more:
`FixedSplitParams` and `FixedSplitImageClassification`, whose validation split is the end of
the training set.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, PositiveInt, field_validator

from torchloom.core.component import (
    Batch,
    BuildContext,
    ComponentParams,
    Task,
)
from torchloom.core.host_copies import host_to_device
from torchloom.core.streams import StreamSpec
from torchloom.errors import ComponentError, DataError, Problem
from torchloom.zoo.image_transforms import (
    ImageTransformer,
    ImageTransforms,
    Normalization,
    build_image_transformer,
    unit_floats,
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
        self.transformer: ImageTransformer = build_image_transformer(
            transforms,
            depth,
            height,
            width,
            normalization,
            subject=self.label,
            where=self._context.where("transforms"),
        )
        self._refuse_random_evaluation(transforms)
        self.class_names = list(class_names)
        # Keyed draws (Task.keyed_draws) when random, unless a subclass's fetch takes none.
        fetch_parameters = inspect.signature(type(self).fetch).parameters
        self.keyed_draws = self.transformer.random and "draws" in fetch_parameters
        self.normalized = transforms.normalize is not None or normalization is not None
        # Filled by prepare(); building the task must not touch the disk.
        self._images: torch.Tensor | None = None
        self._targets: list[int] = []
        self._target_tensor = torch.zeros(0, dtype=torch.int64)  # the same, for batches
        self._loaded = False
        self.publish_global("input_depth", depth)
        self.publish_global("input_height", self.transformer.height)
        self.publish_global("input_width", self.transformer.width)
        self.publish_global("num_classes", len(self.class_names))
        self.publish_global(
            "label_word_mappings", {name: index for index, name in enumerate(self.class_names)}
        )

    def _refuse_random_evaluation(self, transforms: ImageTransforms) -> None:
        """Random steps in a validation or test task would make its statistics those of a
        new random set at every pass: an error, as the result may be wrong. The usual way in
        is a copy of the training task (`task: ${training.task}`), transforms included."""
        section = self._context.name.removesuffix(".task")
        if section not in ("validation", "test") or not self.transformer.random:
            return
        steps = {
            "random_crop": transforms.random_crop is not None,
            "horizontal_flip": transforms.horizontal_flip > 0,
            "cutout": transforms.cutout is not None,
        }
        raise ComponentError(
            [
                Problem(
                    self._context.where("transforms", step),
                    self.label,
                    f"transforms.{step} is a random augmentation, and a {section} task's "
                    "statistics would then be those of another random set at every pass",
                    f"give {section} its own task without random steps: a copy of the "
                    "training task (`task: ${training.task}`) copies its transforms too",
                )
                for step, used in steps.items()
                if used
            ]
        )

    def _param_error(self, parameter: str, message: str, suggestion: str) -> ComponentError:
        return ComponentError(
            [Problem(self._context.where(parameter), self.label, message, suggestion)]
        )

    # ---- streams ----------------------------------------------------------------------------
    def output_specs(self) -> dict[str, StreamSpec]:
        transformer = self.transformer
        images = self.IMAGES_DESCRIPTION + (", standardised" if self.normalized else "")
        return {
            "indices": StreamSpec(("batch",), torch.int64, "position of each sample in the split"),
            "inputs": StreamSpec(
                ("batch", transformer.depth, transformer.height, transformer.width),
                torch.float32,
                images,
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
        if images is not None:
            floats = unit_floats(images)
            kept = self.transformer.precompute(floats)
            # Given back as it was (too big to keep as floats, or nothing to compute but the
            # conversion): keep the uint8 set, 4 times smaller, and convert each sample.
            images = images if kept is floats else kept
        self._images = images
        self._targets = targets
        self._target_tensor = torch.tensor(targets, dtype=torch.int64)
        self._loaded = True

    def sample_targets(self) -> torch.Tensor:
        """The class of every sample of the split, for class-balanced sampling."""
        self.prepare()
        return self._target_tensor.clone()

    def __len__(self) -> int:
        self.prepare()
        return len(self._targets)

    def __getitem__(self, index: int) -> Batch:
        self.prepare()
        index = self.checked_index(index, len(self._targets))
        image = self._images[index] if self._images is not None else self._read_image(index)
        if image.dtype == torch.uint8:  # not precomputed: the same steps, on this image alone
            image = self.transformer.deterministic_steps(image.unsqueeze(0))[0]
        target = self._targets[index]
        sample: dict[str, Any] = {
            "indices": index,
            "inputs": self.transformer(image),
            "targets": target,
            "labels": self.class_names[target],
        }
        return sample

    def fetch(
        self, indices: Sequence[int], draws: tuple[int, Sequence[int]] | None = None
    ) -> Batch:
        """The batch `collate` makes of these samples, gathered with one tensor index when the
        split is held as a tensor: the loaders' path, run on the host between two steps, where
        a batch of 256 built sample by sample cost a millisecond of Python (a quarter of a
        CUDA-graphed ResNet-18 step on 32x32 images; docs/benchmarks.md). Images read from
        files are read one by one. The random transforms run on the whole batch, each image
        with the numbers it draws alone, so the batch is the same, random draws included;
        given `draws` (seed, a draw number per index: the loaders'), from those alone.
        Held on a device (`dataloader.on_device`), the batch is gathered there."""
        self.prepare()
        positions = self.checked_positions(indices, len(self._targets))
        host_targets = self._target_tensor[positions]
        targets, divisor = host_targets, None
        if self._images is None:  # read from files, one by one
            images = torch.stack([self._read_image(index) for index in positions.tolist()])
        elif self.held:  # `dataloader.on_device`: gathered where the data is held
            positions = host_to_device(positions, self.held["images"].device)
            images = self.held["images"].index_select(0, positions)
            targets, divisor = self.held["targets"][positions], self.held["divisor"]
        else:
            images = self._images.index_select(0, positions)
        if images.dtype == torch.uint8:  # not precomputed: the same steps, on these images
            images = self.transformer.deterministic_steps(unit_floats(images, divisor))
        images = self.transformer.random_steps(images, draws)
        return {
            "indices": positions,
            "inputs": images,
            "targets": targets,
            # From the host's targets: reading a GPU's would wait for it at every batch.
            "labels": [self.class_names[target] for target in host_targets.tolist()],
        }

    def tensors_to_hold(self) -> dict[str, torch.Tensor] | None:
        """The split's images and targets, when held as a tensor, and 255 (see unit_floats)."""
        self.prepare()
        if self._images is None:  # read from files, one by one
            return None
        divisor = torch.tensor(255.0)
        return {"images": self._images, "targets": self._target_tensor, "divisor": divisor}


class FixedSplitParams(ComponentParams):
    """Parameters of a dataset published as a training and a test set; a subclass sets
    `data_folder` (its default and description) and `TRAINING_SIZE`."""

    # Images in the training set: validation_size must leave some (checked when the config is).
    TRAINING_SIZE: ClassVar[int]

    data_folder: str = Field(
        ..., description="Folder holding (or receiving) the dataset's files; `~` is expanded."
    )
    split: Literal["train", "validation", "test"] = Field(
        "train",
        description="train: the training images but the last validation_size; validation: "
        "the last validation_size training images; test: the test images.",
    )
    validation_size: int = Field(
        5000,
        ge=0,
        description="How many images at the end of the training set form the validation split.",
    )
    subset: PositiveInt | None = Field(
        None,
        description="Use only the first N samples of the split (quick runs, tests); "
        "a subset larger than the split is clipped to the split.",
    )
    normalize: bool = Field(
        True,
        description="Standardise every channel with the mean and std of the training pixels; "
        "otherwise pixels are in [0, 1].",
    )
    download: bool = Field(
        True,
        description="Download what is missing (and check its md5) when no local or packaged "
        "copy is found. false forbids only the network: an installed packaged copy is still "
        "copied into data_folder (created if need be); run.log says where each split came "
        "from.",
    )
    transforms: ImageTransforms = Field(
        default_factory=ImageTransforms,
        description="Image transforms: {resize, random_crop: {size, padding}, horizontal_flip, "
        "normalize: {mean, std}, cutout}; random ones are training-time augmentation.",
    )

    @field_validator("validation_size")
    @classmethod
    def _leaves_training_images(cls, value: int) -> int:
        if value >= cls.TRAINING_SIZE:
            raise ValueError(f"must be less than the {cls.TRAINING_SIZE} training images")
        return value


class FixedSplitImageClassification(ImageClassificationTask):
    """Base of the tasks on `FixedSplitParams`: checks the split when built, cuts it on load."""

    params: FixedSplitParams

    def __init__(self, params: FixedSplitParams, context: BuildContext) -> None:
        super().__init__(params, context)
        if params.split == "validation" and params.validation_size == 0:
            raise self._param_error(
                "validation_size",
                "split 'validation' is empty because validation_size is 0",
                "set validation_size to the number of validation images, e.g. 5000",
            )
        self.data_folder = Path(params.data_folder).expanduser()

    def _split_slice(self, file_size: int, source: str) -> slice:
        """The samples of the split (and subset) in a file of `file_size` samples: the test
        set, read whole, or the training set (`source`, named in the error when
        validation_size leaves no training images), whose end is the validation split."""
        split, validation_size = self.params.split, self.params.validation_size
        if split != "test" and validation_size >= file_size:
            raise DataError.at(
                source,
                "training images",
                f"validation_size {validation_size} leaves no training images out of {file_size}",
                f"set validation_size below {file_size}",
            )
        start, stop = 0, file_size
        if split == "train":
            stop = file_size - validation_size
        elif split == "validation":
            start = file_size - validation_size
        if self.params.subset is not None:
            stop = min(stop, start + self.params.subset)
        return slice(start, stop)
