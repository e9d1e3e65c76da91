"""The Fashion-MNIST task: 70,000 28x28 grey-scale images of clothes in ten classes."""

from __future__ import annotations

from pydantic import Field

from torchloom.data.gzipped_files import GzippedFile
from torchloom.zoo.tasks.idx_classification import (
    IdxClassificationParams,
    IdxDataset,
    IdxImageClassification,
)

# md5s of the files as published, then of their decompressed content (what packaged copies
# that were re-compressed, such as Debian's, are checked by).
FASHION_MNIST_FILES = (
    GzippedFile(
        "train-images-idx3-ubyte.gz",
        "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "f4a8712d7a061bf5bd6d2ca38dc4d50a",
    ),
    GzippedFile(
        "train-labels-idx1-ubyte.gz",
        "25c81989df183df01b3e8a0aad5dffbe",
        "9018921c3c673c538a1fc5bad174d6f9",
    ),
    GzippedFile(
        "t10k-images-idx3-ubyte.gz",
        "bef4ecab320f06d8554ea6380940ec79",
        "8181f5470baa50b63fa0f6fddb340f0a",
    ),
    GzippedFile(
        "t10k-labels-idx1-ubyte.gz",
        "bb300cfdad3c16e7a12a480ee83cd310",
        "15d484375f8d13e6eb1aabb0c3f46965",
    ),
)
# `apt-get install dataset-fashion-mnist` puts the four files here (re-compressed by Debian).
DEBIAN_FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST = IdxDataset(
    name="Fashion-MNIST",
    files=FASHION_MNIST_FILES,
    mirrors=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
    class_names=(
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    ),
    # Mean and standard deviation of the 60,000 training images' pixels in [0, 1].
    pixel_mean=0.2860,
    pixel_std=0.3530,
    where_else=(
        f"`apt-get install dataset-fashion-mnist` also provides them in {DEBIAN_FASHION_MNIST}"
    ),
    packaged_folders=(DEBIAN_FASHION_MNIST,),
)


class FashionMNISTParams(IdxClassificationParams):
    data_folder: str = Field(
        "~/data/fashion-mnist",
        description="Folder holding (or receiving) the four Fashion-MNIST IDX files, gzipped "
        "as published or decompressed; `~` is expanded.",
    )


class FashionMNIST(IdxImageClassification):
    """Fashion-MNIST (Xiao et al. 2017): 70,000 28x28 grey-scale images of clothes, ten classes.

    Zalando's drop-in replacement for MNIST, with the same file format, sizes and parameters
    as the `MNIST` task.

    The files are looked up in `data_folder`, then in the Debian package
    `dataset-fashion-mnist` (checked by the md5 of their content, since Debian re-compresses
    them; they are copied decompressed, even when `download` is false), then downloaded when
    `download` is true; every file is checked against its md5 and a wrong file in
    `data_folder` is reported, never overwritten. The run's log says where each split came
    from. The validation split is the last `validation_size` training images. Building
    the task reads no data; the data is loaded on first use, or by `prepare()`.

    Streams, per batch: `indices` (position of each sample in the split), `inputs` (images,
    [batch, 1, height, width] float32), `targets` (class index, int64), `labels` (class
    name, e.g. "Ankle boot"). Publishes `input_depth`, `input_height`, `input_width`,
    `num_classes` and `label_word_mappings` ({"T-shirt/top": 0, ..., "Ankle boot": 9}).

    ```yaml
    training:
      task:
        type: FashionMNIST
        split: train
        data_folder: ~/data/fashion-mnist
        transforms: {horizontal_flip: 0.5}
    validation:
      task: {type: FashionMNIST, split: validation, subset: 1000}
    ```
    """

    DATASET = FASHION_MNIST
    Params = FashionMNISTParams
    params: FashionMNISTParams
    IMAGES_DESCRIPTION = "grey-scale images of clothes"
