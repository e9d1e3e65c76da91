"""The CIFAR-10 and CIFAR-100 tasks: 60,000 32x32 colour images in 10 or 100 (20) classes."""

from __future__ import annotations

from typing import ClassVar

import torch
from pydantic import Field

from torchloom.core.component import BuildContext
from torchloom.data import cifar_files
from torchloom.data.cifar_files import CifarRelease, locate_batches, read_batches, read_label_names
from torchloom.data.sources import Origins
from torchloom.errors import DataError
from torchloom.zoo.image_transforms import Normalization
from torchloom.zoo.tasks.image_classification import (
    FixedSplitImageClassification,
    FixedSplitParams,
)

IMAGE_SIZE = 32

CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
# In the order of the meta file (alphabetical), which is the order of the label indices.
CIFAR100_FINE_CLASSES = (
    "apple",
    "aquarium_fish",
    "baby",
    "bear",
    "beaver",
    "bed",
    "bee",
    "beetle",
    "bicycle",
    "bottle",
    "bowl",
    "boy",
    "bridge",
    "bus",
    "butterfly",
    "camel",
    "can",
    "castle",
    "caterpillar",
    "cattle",
    "chair",
    "chimpanzee",
    "clock",
    "cloud",
    "cockroach",
    "couch",
    "crab",
    "crocodile",
    "cup",
    "dinosaur",
    "dolphin",
    "elephant",
    "flatfish",
    "forest",
    "fox",
    "girl",
    "hamster",
    "house",
    "kangaroo",
    "keyboard",
    "lamp",
    "lawn_mower",
    "leopard",
    "lion",
    "lizard",
    "lobster",
    "man",
    "maple_tree",
    "motorcycle",
    "mountain",
    "mouse",
    "mushroom",
    "oak_tree",
    "orange",
    "orchid",
    "otter",
    "palm_tree",
    "pear",
    "pickup_truck",
    "pine_tree",
    "plain",
    "plate",
    "poppy",
    "porcupine",
    "possum",
    "rabbit",
    "raccoon",
    "ray",
    "road",
    "rocket",
    "rose",
    "sea",
    "seal",
    "shark",
    "shrew",
    "skunk",
    "skyscraper",
    "snail",
    "snake",
    "spider",
    "squirrel",
    "streetcar",
    "sunflower",
    "sweet_pepper",
    "table",
    "tank",
    "telephone",
    "television",
    "tiger",
    "tractor",
    "train",
    "trout",
    "tulip",
    "turtle",
    "wardrobe",
    "whale",
    "willow_tree",
    "wolf",
    "woman",
    "worm",
)
CIFAR100_COARSE_CLASSES = (
    "aquatic_mammals",
    "fish",
    "flowers",
    "food_containers",
    "fruit_and_vegetables",
    "household_electrical_devices",
    "household_furniture",
    "insects",
    "large_carnivores",
    "large_man-made_outdoor_things",
    "large_natural_outdoor_scenes",
    "large_omnivores_and_herbivores",
    "medium_mammals",
    "non-insect_invertebrates",
    "people",
    "reptiles",
    "small_mammals",
    "trees",
    "vehicles_1",
    "vehicles_2",
)
# Per-channel mean and standard deviation of the training pixels in [0, 1].
CIFAR10_NORMALIZATION = Normalization(mean=[0.4914, 0.4822, 0.4465], std=[0.2470, 0.2435, 0.2616])
CIFAR100_NORMALIZATION = Normalization(mean=[0.5071, 0.4865, 0.4409], std=[0.2673, 0.2564, 0.2762])


class CIFAR10Params(FixedSplitParams):
    TRAINING_SIZE = 50_000

    data_folder: str = Field(
        "~/data/cifar10",
        description="Folder holding cifar-10-batches-py/ (as extracted) or the archive "
        "cifar-10-python.tar.gz, or receiving the download; `~` is expanded.",
    )


class CIFAR100Params(CIFAR10Params):
    data_folder: str = Field(
        "~/data/cifar100",
        description="Folder holding cifar-100-python/ (as extracted) or the archive "
        "cifar-100-python.tar.gz, or receiving the download; `~` is expanded.",
    )
    fine_labels: bool = Field(
        True, description="true: the 100 fine classes; false: the 20 coarse superclasses."
    )


class _CIFARTask(FixedSplitImageClassification):
    RELEASE: ClassVar[CifarRelease]
    NORMALIZATION: ClassVar[Normalization]
    IMAGES_DESCRIPTION = "colour images"
    params: CIFAR10Params

    def __init__(self, params: CIFAR10Params, context: BuildContext) -> None:
        super().__init__(params, context)
        # The class names are fixed by the dataset, so they are published without reading the
        # meta file; prepare() checks that the files agree.
        normalization = self.NORMALIZATION if params.normalize else None
        names = self._class_names()
        self._setup_images(3, IMAGE_SIZE, IMAGE_SIZE, names, params.transforms, normalization)

    def _class_names(self) -> tuple[str, ...]:
        raise NotImplementedError

    def _label_keys(self) -> tuple[bytes, bytes]:
        """(key of the labels in a batch, key of their names in the meta file)."""
        raise NotImplementedError

    def _load(self) -> tuple[torch.Tensor, list[int]]:
        release = self.RELEASE
        origins = Origins(self.data_folder)
        folder = locate_batches(self.data_folder, release, self.params.download, origins=origins)
        self.note(f"{release.name} {self.params.split} split from {origins.describe()}")
        label_key, names_key = self._label_keys()
        meta = folder / release.meta_file
        if read_label_names(meta, names_key) != list(self.class_names):
            raise DataError.at(
                str(meta),
                f"{release.name} meta file",
                f"its {names_key!r} are not the {len(self.class_names)} {release.name} "
                f"classes ({', '.join(self.class_names[:3])}, ...)",
            )
        split = self.params.split
        names = release.test_files if split == "test" else release.train_files
        images, labels = read_batches(folder, names, label_key, len(self.class_names))
        chosen = self._split_slice(images.shape[0], str(folder / names[-1]))
        return images[chosen], labels[chosen].tolist()


class CIFAR10(_CIFARTask):
    """CIFAR-10 (Krizhevsky 2009): 60,000 32x32 colour images in ten classes.

    50,000 training and 10,000 test images of airplane, automobile, bird, cat, deer, dog,
    frog, horse, ship and truck.

    Reads the standard "python version": `data_folder/cifar-10-batches-py/` with
    `data_batch_1` to `data_batch_5`, `test_batch` and `batches.meta`. When those are missing
    the archive `cifar-10-python.tar.gz` is taken from `data_folder` or downloaded (when
    `download` is true), checked against its md5 and extracted there. The validation split is
    the last `validation_size` training images. Building the task reads no data.

    Streams, per batch: `indices` (position of each sample in the split), `inputs` (images,
    [batch, 3, height, width] float32), `targets` (class index, int64), `labels` (class
    name). Publishes `input_depth`, `input_height`, `input_width`, `num_classes` and
    `label_word_mappings`.

    ```yaml
    training:
      task:
        type: CIFAR10
        data_folder: ~/data/cifar10
        transforms: {random_crop: {size: [32, 32], padding: 4}, horizontal_flip: 0.5}
    validation:
      task: {type: CIFAR10, split: validation}
    ```
    """

    RELEASE = cifar_files.CIFAR10
    NORMALIZATION = CIFAR10_NORMALIZATION
    Params = CIFAR10Params
    params: CIFAR10Params

    def _class_names(self) -> tuple[str, ...]:
        return CIFAR10_CLASSES

    def _label_keys(self) -> tuple[bytes, bytes]:
        return b"labels", b"label_names"


class CIFAR100(_CIFARTask):
    """CIFAR-100 (Krizhevsky 2009): 60,000 32x32 colour images in 100 (or 20 coarse) classes.

    50,000 training and 10,000 test images of 100 fine classes grouped in 20 coarse
    superclasses; `fine_labels` picks which are the targets.

    Reads the standard "python version": `data_folder/cifar-100-python/` with `train`,
    `test` and `meta`. When those are missing the archive `cifar-100-python.tar.gz` is taken
    from `data_folder` or downloaded (when `download` is true), checked against its md5 and
    extracted there. The validation split is the last `validation_size` training images.
    Building the task reads no data.

    Streams, per batch: `indices` (position of each sample in the split), `inputs` (images,
    [batch, 3, height, width] float32), `targets` (fine or coarse class index, int64),
    `labels` (its name). Publishes `input_depth`, `input_height`, `input_width`,
    `num_classes` (100 or 20) and `label_word_mappings`.

    ```yaml
    training:
      task: {type: CIFAR100, data_folder: ~/data/cifar100, fine_labels: false}
    ```
    """

    RELEASE = cifar_files.CIFAR100
    NORMALIZATION = CIFAR100_NORMALIZATION
    Params = CIFAR100Params
    params: CIFAR100Params

    def _class_names(self) -> tuple[str, ...]:
        return CIFAR100_FINE_CLASSES if self.params.fine_labels else CIFAR100_COARSE_CLASSES

    def _label_keys(self) -> tuple[bytes, bytes]:
        if self.params.fine_labels:
            return b"fine_labels", b"fine_label_names"
        return b"coarse_labels", b"coarse_label_names"
