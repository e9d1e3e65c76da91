"""The ImageFolder task: images sorted into one folder per class, torchvision's layout."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import torch
from PIL import Image, UnidentifiedImageError
from pydantic import Field, PositiveInt
from torchvision.transforms.v2 import functional as TF

from torchloom.core.component import BuildContext
from torchloom.core.file_names import PlainFileName
from torchloom.data.image_modes import eight_bit
from torchloom.errors import DataError, Problem
from torchloom.zoo.image_transforms import ImageTransforms
from torchloom.zoo.tasks.drawn_split import DrawnSplitParams, DrawnSplitTask
from torchloom.zoo.tasks.image_classification import ImageClassificationTask

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
LAYOUT = "one sub-folder per class holding its images (data_folder/<class>/<image>.png|jpg)"


class ImageFolderParams(DrawnSplitParams):
    data_folder: str = Field(
        ..., description="Folder with one sub-folder of images per class; `~` is expanded."
    )
    classes: list[PlainFileName] | None = Field(
        None,
        description="The class sub-folders to read, in class-index order; default: every "
        "sub-folder, sorted (listed when the task is built, so `loom check` needs the folder "
        "unless the classes are given here).",
    )
    image_size: Annotated[list[PositiveInt], Field(min_length=2, max_length=2)] = Field(
        [224, 224],
        description="[height, width] every image is resized to when read, so batches stack.",
    )
    grayscale: bool = Field(
        False, description="Read images as one grey channel; otherwise as three RGB channels."
    )
    validation_fraction: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Share of every class's images in the validation split; with both "
        "fractions 0, train is the whole folder (a folder that already is one split).",
    )
    test_fraction: float = Field(
        0.0, ge=0.0, lt=1.0, description="Share of every class's images in the test split."
    )
    transforms: ImageTransforms = Field(
        default_factory=ImageTransforms,
        description="Image transforms: {resize, random_crop: {size, padding}, horizontal_flip, "
        "normalize: {mean, std}, cutout}; random ones are training-time augmentation.",
    )


class ImageFolder(ImageClassificationTask, DrawnSplitTask):
    """Images sorted into one sub-folder per class, torchvision's ImageFolder layout.

    `data_folder/<class>/<image>` (png, jpg, ...); the classes are the sub-folders, sorted by
    name, unless `classes` lists them.

    Every image is read when its sample is asked for, converted to RGB (or grey) and resized
    to `image_size`. The validation and test splits are drawn from every class separately
    (`validation_fraction`, `test_fraction` of its images, at random with `split_seed`), so the
    three splits of one folder never overlap and keep the class proportions. Hidden files and
    files of other types are skipped; a class folder without images, or an image that cannot
    be read, is an error naming it.

    Streams, per batch: `indices` (position of each sample in the split), `inputs` (images,
    [batch, depth, height, width] float32 in [0, 1] unless normalised), `targets` (class
    index, int64), `labels` (class name). Publishes `input_depth`, `input_height`,
    `input_width`, `num_classes` and `label_word_mappings`.

    ```yaml
    training:
      task:
        type: ImageFolder
        data_folder: ~/data/flowers
        image_size: [64, 64]
        split: train
        validation_fraction: 0.1
        test_fraction: 0.1
        transforms: {horizontal_flip: 0.5, normalize: {mean: [0.5], std: [0.5]}}
    validation:
      task: {type: ImageFolder, data_folder: ~/data/flowers, image_size: [64, 64],
             split: validation, validation_fraction: 0.1, test_fraction: 0.1}
    ```
    """

    Params = ImageFolderParams
    params: ImageFolderParams
    IMAGES_DESCRIPTION = "images"

    def __init__(self, params: ImageFolderParams, context: BuildContext) -> None:
        super().__init__(params, context)
        for split, fraction in [("validation", "validation_fraction"), ("test", "test_fraction")]:
            if params.split == split and getattr(params, fraction) == 0:
                raise self._param_error(
                    fraction,
                    f"split '{split}' is empty because {fraction} is 0",
                    f"set {fraction}, e.g. 0.1, in every task reading this folder",
                )
        self.data_folder = Path(params.data_folder).expanduser()
        classes = params.classes if params.classes is not None else self._class_folders()
        height, width = params.image_size
        depth = 1 if params.grayscale else 3
        self._setup_images(depth, height, width, classes, params.transforms, None)
        self._files: list[Path] = []

    def _error(self, where: Path, message: str, suggestion: str = "") -> DataError:
        return DataError([Problem(str(where), self.label, message, suggestion)])

    def _class_folders(self) -> list[str]:
        """The class sub-folders, sorted; a directory listing only, no image is opened."""
        if not self.data_folder.is_dir():
            raise self._error(
                self.data_folder,
                f"the data folder does not exist; it should hold {LAYOUT}",
                "fix data_folder, or list `classes` to check the config without the data",
            )
        names = sorted(
            entry.name
            for entry in self.data_folder.iterdir()
            if entry.is_dir() and not entry.name.startswith(".")
        )
        if not names:
            raise self._error(
                self.data_folder,
                f"the data folder has no class sub-folders; it should hold {LAYOUT}",
            )
        return names

    def _images_of(self, name: str) -> list[Path]:
        folder = self.data_folder / name
        if not folder.is_dir():
            raise self._error(
                folder, f"class '{name}' has no folder; {self.data_folder} should hold {LAYOUT}"
            )
        files = sorted(
            path
            for path in folder.iterdir()
            if path.suffix.lower() in IMAGE_EXTENSIONS
            and not path.name.startswith(".")
            and path.is_file()
        )
        if not files:
            raise self._error(
                folder,
                f"class '{name}' has no images (looked for {', '.join(IMAGE_EXTENSIONS)})",
                "add images or remove the folder",
            )
        return files

    def _load(self) -> tuple[None, list[int]]:
        params = self.params
        chosen: list[tuple[Path, int]] = []
        for index, name in enumerate(self.class_names):
            files = self._images_of(name)
            # Each class is drawn on its own, with the same seed: adding images to one class
            # does not move the others' between splits.
            order = torch.randperm(
                len(files), generator=torch.Generator().manual_seed(params.split_seed)
            )
            test_count = round(len(files) * params.test_fraction)
            validation_count = round(len(files) * params.validation_fraction)
            bounds = {
                "test": (0, test_count),
                "validation": (test_count, test_count + validation_count),
                "train": (test_count + validation_count, len(files)),
            }
            start, stop = bounds[params.split]
            chosen += [(files[int(i)], index) for i in order[start:stop]]
        if not chosen:
            raise self._error(
                self.data_folder,
                f"split '{params.split}' holds no images: every class is too small for its "
                "fraction",
                "raise the fraction or add images",
            )
        # A seeded order mixing the classes, so that a subset holds several of them.
        generator = torch.Generator().manual_seed(params.split_seed)
        shuffled = [chosen[int(i)] for i in torch.randperm(len(chosen), generator=generator)]
        if params.subset is not None:
            shuffled = shuffled[: params.subset]
        self._files = [path for path, _ in shuffled]
        return None, [target for _, target in shuffled]

    @property
    def read_size(self) -> tuple[int, int]:
        """[height, width] every file is resized to as it is read (PIL, bilinear), before the
        transforms: a deployment resizes the same way (deploy/sidecar.py)."""
        height, width = self.params.image_size
        return int(height), int(width)

    def _read_image(self, index: int) -> torch.Tensor:
        path = self._files[index]
        height, width = self.params.image_size
        try:
            with Image.open(path) as image:
                converted = eight_bit(image).convert("L" if self.params.grayscale else "RGB")
                resized = converted.resize((width, height), Image.Resampling.BILINEAR)
        except (OSError, UnidentifiedImageError, ValueError) as error:
            raise self._error(path, f"cannot be read as an image: {error}") from error
        return TF.pil_to_tensor(resized)
