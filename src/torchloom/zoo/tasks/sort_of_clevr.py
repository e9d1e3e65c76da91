"""The Sort-of-CLEVR task (Santoro et al. 2017): scenes generated from a seed and cached in a
data folder (see `torchloom.data.sort_of_clevr_scenes` for the scenes, questions and answers),
served as (image, question) samples.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import Field, PositiveInt

from torchloom.core.component import Batch, BuildContext, ComponentParams, Task
from torchloom.core.host_copies import host_to_device
from torchloom.core.streams import StreamSpec
from torchloom.data.sort_of_clevr_scenes import (
    ANSWERS,
    COLOURS,
    FORMAT_VERSION,
    OBJECTS,
    QUESTION_SIZE,
    QUESTION_TEXTS,
    QUESTION_TYPES,
    QUESTION_VECTORS,
    SUBTYPES,
    generate,
    load_cache,
    save_atomic,
)
from torchloom.errors import ComponentError, DataError
from torchloom.host_memory import short_of_memory

LOGGER = logging.getLogger("torchloom.data")

# Per-channel mean and std of the pixels in [0, 1] of the default 75x75 images (measured on
# 2,000 generated training images; they hardly move with the seed), for `normalize`.
PIXEL_MEAN = (0.9516, 0.9440, 0.9127)
PIXEL_STD = (0.2030, 0.2084, 0.2736)


class SortOfCLEVRParams(ComponentParams):
    data_folder: str = Field(
        "~/data/sort_of_clevr",
        description="Folder the generated splits are cached in (one .npz per split and set "
        "of generation parameters); `~` is expanded.",
    )
    split: Literal["train", "validation", "test"] = Field(
        "train", description="Which split: each is drawn from its own seeds, none overlap."
    )
    images: PositiveInt = Field(
        1000, le=1_000_000, description="Images in the split (the paper: 9,800 for training)."
    )
    questions_per_type: PositiveInt = Field(
        10,
        le=100,
        description="Non-relational questions per image, and as many relational ones "
        "(the paper: 10 and 10).",
    )
    image_size: int = Field(75, ge=16, le=512, description="Side of the square images.")
    object_size: PositiveInt = Field(
        5,
        description="Half the side of a square, and the radius of a circle, in pixels "
        "(the paper: 5); at most image_size / 8 - 1/2, so that six objects always fit.",
    )
    seed: int = Field(0, ge=0, description="Seed the images and questions are drawn from.")
    normalize: bool = Field(
        False,
        description="Standardise every channel with the pixel mean and std of the "
        "default images; otherwise pixels are in [0, 1], as in the reference code.",
    )


# The per-question arrays a batch gathers (answers, the colour asked about, the subtype).
QUESTION_ARRAYS = ("colours", "subtypes", "answers")


def scaled(images: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """uint8 pixels to floats, `pixel * scale + shift` ([0, 1], standardised with `normalize`).
    Not addcmul: with uint8 input and broadcasting it is 15 times slower than a multiply then
    an add."""
    return images.float().mul_(scale).add_(shift)


class SortOfCLEVR(Task):
    """Sort-of-CLEVR (Santoro et al. 2017, "A simple neural network module for relational
    reasoning"): images of six coloured squares and circles, each with non-relational and
    relational questions encoded as 11-number vectors, answered from a 10-word vocabulary.

    Generated on first use (`prepare()`) from `seed` and cached in `data_folder` as
    `sort_of_clevr-v1-<split>-...-seed<seed>.npz`, a name that holds every generation
    parameter; it is written atomically and carries a sha256 of its arrays, so a damaged
    cache is detected, reported in the log and generated again. Samples are (image,
    question) pairs: sample `k` is question `k % (2 * questions_per_type)` of image
    `k // (2 * questions_per_type)`, the non-relational questions of an image first.

    Streams, per batch: `indices` (position of the sample in the split), `images` (float32
    [batch, 3, image_size, image_size], in [0, 1] unless `normalize`), `questions` (float32
    [batch, 11]: colour one-hot, type one-hot, subtype one-hot), `targets` (answer index,
    int64), `question_types` (int64: 0 non-relational, 1 relational), `question_subtypes`
    (int64: 0 shape, 1 horizontal, 2 vertical, 3 closest, 4 furthest, 5 count), `labels`
    (the answer word) and `question_texts` (the question in English). Publishes
    `num_classes` (10), `question_size` (11), `input_depth` (3), `input_height`,
    `input_width`, `label_word_mappings` (answer word -> index),
    `question_type_names` (["non_relational", "relational"]) and `question_subtype_names`
    (["shape", "horizontal", "vertical", "closest_shape", "furthest_shape", "count"]).

    ```yaml
    training:
      task: {type: SortOfCLEVR, split: train, images: 9800, data_folder: ~/data/sort_of_clevr}
    validation:
      task: {type: SortOfCLEVR, split: validation, images: 1000}
    ```
    """

    Params = SortOfCLEVRParams
    params: SortOfCLEVRParams
    PUBLISHES_GLOBALS = {
        "num_classes": "number of answer words (10)",
        "question_size": "length of the question vectors (11)",
        "input_depth": "number of channels of the images (3)",
        "input_height": "image height in pixels",
        "input_width": "image width in pixels",
        "label_word_mappings": "answer word -> answer index",
        "question_type_names": "name of every question_types value",
        "question_subtype_names": "name of every question_subtypes value",
    }

    def __init__(self, params: SortOfCLEVRParams, context: BuildContext) -> None:
        super().__init__(params, context)
        # Six boxes of 2 * object_size + 1 pixels fit in a row of four with room to spare.
        if 4 * (2 * params.object_size + 1) > params.image_size:
            raise ComponentError.at(
                context.where("object_size"),
                self.label,
                f"object_size {params.object_size} is too large for images of "
                f"{params.image_size} pixels: six objects may not fit",
                f"use object_size <= {(params.image_size // 4 - 1) // 2} or larger images",
            )
        self.data_folder = Path(params.data_folder).expanduser()
        self.per_image = 2 * params.questions_per_type
        self._check_memory(context)
        self._arrays: dict[str, np.ndarray] | None = None
        self._images: torch.Tensor | None = None
        self._questions: dict[str, torch.Tensor] = {}
        # pixel * scale + shift: [0, 255] to [0, 1], standardised with `normalize`; one
        # multiply-add per sample, or per batch in `fetch`.
        mean = torch.tensor(PIXEL_MEAN if params.normalize else (0.0, 0.0, 0.0))
        std = torch.tensor(PIXEL_STD if params.normalize else (1.0, 1.0, 1.0))
        self._scale = (1.0 / (255.0 * std)).view(3, 1, 1)
        self._shift = (-mean / std).view(3, 1, 1)
        size = params.image_size
        self.publish_global("num_classes", len(ANSWERS))
        self.publish_global("question_size", QUESTION_SIZE)
        self.publish_global("input_depth", 3)
        self.publish_global("input_height", size)
        self.publish_global("input_width", size)
        self.publish_global("label_word_mappings", {w: i for i, w in enumerate(ANSWERS)})
        self.publish_global("question_type_names", list(QUESTION_TYPES))
        self.publish_global("question_subtype_names", list(SUBTYPES))

    def _check_memory(self, context: BuildContext) -> None:
        """The split is generated and held whole: a size that cannot fit is refused now (by
        `loom check` too), not after hours of drawing scenes into a MemoryError. Half the
        memory available at most: the training needs its own."""
        p = self.params
        # uint8 pixels; per question three int8 arrays and their int64 tensors (prepare()).
        per_image = 3 * p.image_size**2 + self.per_image * 3 * (1 + 8)
        need = p.images * per_image
        available = short_of_memory(need)
        if available is None:
            return
        raise ComponentError.at(
            context.where("images"),
            self.label,
            f"{p.images} images of {p.image_size}x{p.image_size} pixels need about "
            f"{need / 2**30:.1f} GiB, more than half of the {available / 2**30:.1f} GiB of "
            "memory available",
            f"use images <= {max(1, available // 2 // per_image)}, or smaller images",
        )

    @property
    def cache_path(self) -> Path:
        p = self.params
        name = (
            f"sort_of_clevr-v{FORMAT_VERSION}-{p.split}-{p.images}img-{p.questions_per_type}q"
            f"-{p.image_size}px-{p.object_size}obj-seed{p.seed}.npz"
        )
        return self.data_folder / name

    # ---- streams ----------------------------------------------------------------------------
    def output_specs(self) -> dict[str, StreamSpec]:
        size = self.params.image_size
        images = "images" + (", standardised" if self.params.normalize else ", in [0, 1]")
        return {
            "indices": StreamSpec(("batch",), torch.int64, "position of each sample in the split"),
            "images": StreamSpec(("batch", 3, size, size), torch.float32, images),
            "questions": StreamSpec(
                ("batch", QUESTION_SIZE), torch.float32, "colour, type and subtype one-hots"
            ),
            "targets": StreamSpec(("batch",), torch.int64, "answer index"),
            "question_types": StreamSpec(("batch",), torch.int64, "0 non-relational, 1 relational"),
            "question_subtypes": StreamSpec(
                ("batch",), torch.int64, "0-2 non-relational, 3-5 relational subtypes"
            ),
            "labels": StreamSpec(("batch",), str, "answer word"),
            "question_texts": StreamSpec(("batch",), str, "the question in English"),
        }

    def dimension_sizes(self) -> dict[str, int]:
        return {"classes": len(ANSWERS)}

    # ---- data -------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Read the cached split, or generate and cache it; idempotent."""
        if self._arrays is not None:
            return
        p = self.params
        path = self.cache_path
        shapes = {
            "images": (p.images, 3, p.image_size, p.image_size),
            "objects": (p.images, OBJECTS, 3),
            "answers": (p.images, self.per_image),
        }
        arrays = None
        if path.exists():
            try:
                arrays = load_cache(path, shapes)
            except ValueError as error:
                # Derived data, not a user's original: generating it again loses nothing.
                LOGGER.warning(
                    "%s: damaged Sort-of-CLEVR cache (%s); generating it again", path, error
                )
        if arrays is None:
            arrays = generate(
                p.split, p.images, p.questions_per_type, p.image_size, p.object_size, p.seed
            )
            try:
                self.data_folder.mkdir(parents=True, exist_ok=True)
                save_atomic(path, arrays)
            except OSError as error:
                raise DataError.at(
                    str(path),
                    "Sort-of-CLEVR cache",
                    f"cannot be written: {error}",
                    "set data_folder to a writable folder",
                ) from error
        self._arrays = arrays
        self._images = torch.from_numpy(arrays["images"])
        # Per sample (image-major, as the sample index): what samples and batches read.
        self._questions = {
            name: torch.from_numpy(arrays[name].reshape(-1).astype(np.int64))
            for name in QUESTION_ARRAYS
        }

    def arrays(self) -> dict[str, np.ndarray]:
        """The generated arrays (see `generate`), for analysis and tests."""
        self.prepare()
        assert self._arrays is not None
        return self._arrays

    def sample_targets(self) -> torch.Tensor:
        self.prepare()
        return self._questions["answers"]

    def __len__(self) -> int:
        return self.params.images * self.per_image

    def __getitem__(self, index: int) -> Batch:
        self.prepare()
        assert self._images is not None
        index = self.checked_index(index, len(self))
        colour, subtype, answer = (int(self._questions[name][index]) for name in QUESTION_ARRAYS)
        return {
            "indices": index,
            "images": scaled(self._images[index // self.per_image], self._scale, self._shift),
            "questions": QUESTION_VECTORS[colour, subtype].clone(),
            "targets": answer,
            "question_types": subtype // 3,
            "question_subtypes": subtype,
            "labels": ANSWERS[answer],
            "question_texts": QUESTION_TEXTS[subtype].format(COLOURS[colour]),
        }

    def fetch(self, indices: Sequence[int]) -> Batch:
        """The batch `collate` makes of these samples, gathered with a few tensor operations:
        the loaders' path, cheaper than building the samples one by one (see
        benchmarks/input_pipeline.py); held on a device (`dataloader.on_device`), gathered
        there."""
        self.prepare()
        assert self._images is not None
        positions = self.checked_positions(indices, len(self))
        # The words from the host's arrays: reading a GPU's would wait for it at every batch.
        colours, subtypes, answers = (self._questions[name][positions] for name in QUESTION_ARRAYS)
        texts = {
            "labels": [ANSWERS[answer] for answer in answers.tolist()],
            "question_texts": [
                QUESTION_TEXTS[subtype].format(COLOURS[colour])
                for colour, subtype in zip(colours.tolist(), subtypes.tolist(), strict=True)
            ],
        }
        source: Mapping[str, torch.Tensor]
        if self.held:  # `dataloader.on_device`: gathered where the data is held
            source = self.held
            positions = host_to_device(positions, source["images"].device)
            colours, subtypes, answers = (source[name][positions] for name in QUESTION_ARRAYS)
        else:
            source = self.tensors_to_hold()
        # index_select: ten times faster than advanced indexing for a uint8 gather.
        images = source["images"].index_select(0, positions // self.per_image)
        return {
            "indices": positions,
            "images": scaled(images, source["scale"], source["shift"]),
            "questions": source["question_vectors"][colours, subtypes],
            "targets": answers,
            "question_types": subtypes // 3,
            "question_subtypes": subtypes,
            **texts,
        }

    def tensors_to_hold(self) -> dict[str, torch.Tensor]:
        """What `fetch` gathers from and computes with: the images, the questions' arrays,
        the one-hot question vectors and the pixels' scale and shift."""
        self.prepare()
        assert self._images is not None
        return {
            "images": self._images,
            **self._questions,
            "question_vectors": QUESTION_VECTORS,
            "scale": self._scale,
            "shift": self._shift,
        }

    def collate(self, samples: list[Batch]) -> Batch:
        # The batch built directly: torch's default_collate costs as much as the samples.
        batch: Batch = {
            name: torch.stack([sample[name] for sample in samples])
            for name in ("images", "questions")
        }
        for name in ("indices", "targets", "question_types", "question_subtypes"):
            batch[name] = torch.tensor([sample[name] for sample in samples], dtype=torch.int64)
        for name in ("labels", "question_texts"):
            batch[name] = [sample[name] for sample in samples]
        return batch
