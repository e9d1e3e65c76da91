"""Image classification from the four IDX files of MNIST-like datasets (MNIST, Fashion-MNIST,
and any other 28x28 grey-scale set published the same way, such as KMNIST).

A dataset is described once as an `IdxDataset` (files and checksums, mirrors, packaged
copies, class names, pixel statistics); a task is then a subclass of `IdxImageClassification`
that names it, with a params class that only changes the default `data_folder`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar, Literal, NoReturn

import torch
from pydantic import Field, PositiveInt

from torchloom.core.component import BuildContext
from torchloom.data.gzipped_files import GzippedFile, ensure_gzipped_files
from torchloom.data.idx import idx_images_view, read_idx_labels
from torchloom.data.sources import Origins, packaged_copy
from torchloom.errors import DataError
from torchloom.zoo.image_transforms import Normalization
from torchloom.zoo.tasks.image_classification import (
    FixedSplitImageClassification,
    FixedSplitParams,
)


@dataclass(frozen=True)
class IdxDataset:
    """Everything that tells one IDX dataset from another."""

    name: str
    # train-images, train-labels, t10k-images, t10k-labels, with their checksums.
    files: tuple[GzippedFile, ...]
    mirrors: tuple[str, ...]
    class_names: tuple[str, ...]
    pixel_mean: float  # of the training pixels scaled to [0, 1]
    pixel_std: float
    where_else: str  # where else the files can be had, for the error when they are missing
    packaged_folders: tuple[str, ...] = ()  # absolute folders (apt packages)
    packaged_in_packages: tuple[tuple[str, str], ...] = ()  # (pip package, folder inside)
    image_size: int = 28
    # Whether preparing any split fetches all four files rather than the split's two (MNIST
    # always has: a test run leaves a folder that a later, maybe offline, training run can use).
    fetch_every_split: bool = False

    def file(self, prefix: str, kind: Literal["images", "labels"]) -> GzippedFile:
        name = f"{prefix}-{kind}-idx{3 if kind == 'images' else 1}-ubyte.gz"
        return next(file for file in self.files if file.name == name)

    @property
    def layout_hint(self) -> str:
        """What the data folder should hold, for the error when it does not."""
        names = ", ".join(file.name for file in self.files)
        return (
            f"the four {self.name} files, gzipped as published or decompressed ({names}); "
            f"{self.where_else}"
        )

    def packaged(self) -> list[Path]:
        """Installed copies, without importing the packages that hold them."""
        folders = [Path(folder) for folder in self.packaged_folders]
        for package, relative in self.packaged_in_packages:
            found = packaged_copy(package, relative)
            if found is not None:
                folders.append(found)
        return [folder for folder in folders if folder.is_dir()]


class IdxClassificationParams(FixedSplitParams):
    TRAINING_SIZE = 60_000

    data_folder: str = Field(
        ...,
        description="Folder holding (or receiving) the four IDX files, gzipped as published "
        "or decompressed; `~` is expanded.",
    )
    # Older than `transforms` (MNIST had it first), kept so that configs keep working.
    resize: Annotated[list[PositiveInt], Field(min_length=2, max_length=2)] | None = Field(
        None,
        description="[height, width] to resize every image to (bilinear, once when the data "
        "is loaded), e.g. [32, 32]; the same as transforms.resize.",
    )


class IdxImageClassification(FixedSplitImageClassification):
    """Base of the IDX tasks; a subclass sets `DATASET` and `Params`."""

    DATASET: ClassVar[IdxDataset]
    Params = IdxClassificationParams
    params: IdxClassificationParams

    def __init__(self, params: IdxClassificationParams, context: BuildContext) -> None:
        super().__init__(params, context)
        transforms = params.transforms
        if params.resize is not None:
            if transforms.resize is not None:
                raise self._param_error(
                    "resize",
                    "both `resize` and `transforms.resize` are set",
                    "keep one of them",
                )
            transforms = transforms.model_copy(update={"resize": params.resize})
        dataset = self.DATASET
        normalization = (
            Normalization(mean=[dataset.pixel_mean], std=[dataset.pixel_std])
            if params.normalize
            else None
        )
        size = dataset.image_size
        self._setup_images(1, size, size, dataset.class_names, transforms, normalization)

    def _load(self) -> tuple[torch.Tensor, list[int]]:
        dataset = self.DATASET
        prefix = "t10k" if self.params.split == "test" else "train"
        images_file, labels_file = dataset.file(prefix, "images"), dataset.file(prefix, "labels")
        origins = Origins(self.data_folder)
        paths = ensure_gzipped_files(
            self.data_folder,
            dataset.files if dataset.fetch_every_split else (images_file, labels_file),
            packaged=dataset.packaged(),
            mirrors=dataset.mirrors,
            allow_download=self.params.download,
            layout_hint=dataset.layout_hint,
            origins=origins,
        )
        # Where the data came from, in the run's log: a folder can be created and filled from
        # a packaged copy with download false (a packaged copy is not a download).
        self.note(f"{dataset.name} {self.params.split} split from {origins.describe()}")
        images_path = paths[images_file.name]
        images = idx_images_view(images_path)  # checked; no image copied yet
        labels = read_idx_labels(paths[labels_file.name])
        size = dataset.image_size
        if images.shape[0] != labels.shape[0] or images.shape[1:] != (size, size):
            self._malformed(
                images_path,
                f"expected {labels.shape[0]} images of {size}x{size} matching the labels, "
                f"found shape {list(images.shape)}",
            )
        classes = len(dataset.class_names)
        if labels.numel() and not (int(labels.min()) >= 0 and int(labels.max()) < classes):
            self._malformed(
                paths[labels_file.name],
                f"labels must be class indices 0 to {classes - 1}, found "
                f"{int(labels.min())} to {int(labels.max())}",
            )
        split = self._split_slice(images.shape[0], str(images_path))
        # Only the split's (and subset's) images are copied out of the file.
        return torch.from_numpy(images[split].copy()).unsqueeze(1), labels[split].tolist()

    def _malformed(self, path: Path, message: str) -> NoReturn:
        raise DataError.at(str(path), f"{self.DATASET.name} file", message)
