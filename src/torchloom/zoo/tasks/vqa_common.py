"""What the visual-question-answering readers (CLEVR, VQAMed2019, GQA) share.

A reader parses its question files in `_load()` into `QARecord`s (image file, question,
answer, answer index, task-specific integer fields); this base turns them into samples,
reading and resizing each image only when its sample is asked for, so that a split of a
million questions costs only its text in memory. Samples carry the default stream names
`indices`, `images`, `questions`, `answers`, `targets` and one int64 stream per name in the
reader's `EXTRA_STREAMS` (`question_families`, `categories`, ...).

Building a reader reads nothing (so `loom check` needs no data); `prepare()` parses the
question files once. `texts(stream)` yields questions or answers straight from the parsed
records, without opening an image, which is what a `SentenceIndexer` building its vocabulary
from the training questions needs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from pydantic import ConfigDict, Field, PositiveFloat, PositiveInt, model_validator

from torchloom.config_model import ConfigModel
from torchloom.core.component import Batch, BuildContext, ComponentParams, Task
from torchloom.core.streams import StreamSpec
from torchloom.data.image_modes import eight_bit
from torchloom.errors import ComponentError, DataError, Problem

# The ignore index of torch's losses: the target of a question whose answer is unknown (test
# splits) or outside the answer set, so that losses and accuracies skip it.
IGNORE_INDEX = -100
# The value of an integer field (question family, category, type) the split does not give.
UNKNOWN = -1

Size2D = Annotated[list[PositiveInt], Field(min_length=2, max_length=2)]

VQA_GLOBALS = {
    "input_depth": "number of channels of the images (3, RGB)",
    "input_height": "image height in pixels, after resizing",
    "input_width": "image width in pixels, after resizing",
}


class Normalization(ConfigModel):
    """Per-channel standardisation of [0, 1] pixels: (pixel - mean) / std.

    The image tasks' `transforms.normalize` has the same fields; it is not reused because its
    module imports torchvision, which would make `loom check` of a VQA pipeline seconds slower
    for nothing: the readers need PIL and torch only.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    mean: list[float] = Field(..., min_length=1, description="One mean, or one per channel.")
    std: list[PositiveFloat] = Field(
        ..., min_length=1, description="One standard deviation, or one per channel."
    )

    @model_validator(mode="after")
    def _same_length(self) -> Normalization:
        if len(self.mean) != len(self.std):
            raise ValueError(f"mean has {len(self.mean)} values but std has {len(self.std)}")
        return self


@dataclass(slots=True)
class QARecord:
    """One question of a split: everything but the image's pixels. `extras` holds the
    reader's integer fields in `EXTRA_STREAMS` order (a tuple, not a dict: a split can have a
    million questions); the questions of one image share its `Path`."""

    image: Path
    question: str
    answer: str
    target: int
    extras: tuple[int, ...] = ()


class ImagePaths:
    """The path of every image file of a folder, made once per image and shared by its
    questions (CLEVR asks about 10 questions per image, GQA about 15)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._paths: dict[str, Path] = {}

    def __call__(self, name: str) -> Path:
        path = self._paths.get(name)
        if path is None:
            path = self._paths[name] = self.folder / name
        return path


class VQAParams(ComponentParams):
    """Parameters every reader has; a reader redefines `data_folder` and `split` (their
    defaults and the splits differ; declared here so that they come first in the docs) and
    adds its own."""

    data_folder: str = Field(..., description="Folder holding the dataset; `~` is expanded.")
    split: str = Field("train", description="Which split of the dataset to read.")
    resize: Size2D | None = Field(
        None,
        description="[height, width] every image is resized to (bilinear) when read, so that "
        "batches stack; default: the dataset's own size where it has one.",
    )
    normalize: Normalization | None = Field(
        None,
        description="{mean: [...], std: [...]}: standardise every channel of the [0, 1] pixels, "
        "e.g. with the ImageNet mean [0.485, 0.456, 0.406] and std [0.229, 0.224, 0.225] for "
        "pretrained encoders; default: pixels stay in [0, 1].",
    )
    subset: PositiveInt | None = Field(
        None,
        description="Use only N questions of the split, drawn at random with subset_seed and "
        "kept in file order (quick runs, tests); a subset larger than the split is the split.",
    )
    subset_seed: int = Field(0, description="Seed of the subset's draw.")


def data_error(where: str | Path, subject: str, message: str, suggestion: str = "") -> DataError:
    return DataError([Problem(str(where), subject, message, suggestion)])


def read_rgb_image(
    path: Path, height: int, width: int, normalization: Normalization | None, subject: str
) -> torch.Tensor:
    """The image at `path` as float32 [3, height, width] in [0, 1] (or standardised).

    Resized with PIL before the conversion to a tensor, so a 480x320 CLEVR image resized to
    64x64 never becomes a large float tensor. A missing or unreadable file is a DataError
    naming it.
    """
    if not path.is_file():
        raise data_error(
            path,
            subject,
            "the image file is missing (a question of the split refers to it)",
            "extract the dataset's images next to its question files, as its layout says",
        )
    try:
        with Image.open(path) as image:
            rgb = eight_bit(image).convert("RGB")
            if rgb.size != (width, height):
                rgb = rgb.resize((width, height), Image.Resampling.BILINEAR)
            pixels = np.array(rgb, dtype=np.uint8)  # [height, width, 3], a copy
    except (OSError, UnidentifiedImageError, ValueError) as error:
        raise data_error(path, subject, f"cannot be read as an image: {error}") from error
    # Divided rather than multiplied by 1/255, as the image-classification tasks do.
    tensor = torch.from_numpy(pixels).permute(2, 0, 1).to(torch.float32).div_(255.0)
    if normalization is not None:
        mean = torch.tensor(_per_channel(normalization.mean)).view(3, 1, 1)
        std = torch.tensor(_per_channel(normalization.std)).view(3, 1, 1)
        tensor = tensor.sub_(mean).div_(std)
    return tensor.contiguous()


def _per_channel(values: Sequence[float]) -> list[float]:
    return list(values) * 3 if len(values) == 1 else list(values)


class VQATask(Task):
    """Base of the VQA readers; not a component of its own.

    A subclass sets `EXTRA_STREAMS` ({name: description} of its int64 per-question fields),
    `NATIVE_SIZE` ([height, width] of its images when they all have one size, else None, in
    which case its `resize` has a default), and implements `_load()`.

    A reader whose answers are open (no fixed answer list) sets `ANSWERS_FROM_TRAINING` and
    implements `_training_records()`: its targets then index the sorted answers of the
    training split: those of the pipeline's training task when it is a reader of the same
    kind (so that they agree with a classifier sized on that task, subset included), else
    those of the training files in `data_folder`. Its training splits must give every
    question an answer, as an empty answer would be one more label to a `LabelIndexer`.
    """

    PUBLISHES_GLOBALS: ClassVar[dict[str, str]] = VQA_GLOBALS
    EXTRA_STREAMS: ClassVar[dict[str, str]] = {}
    NATIVE_SIZE: ClassVar[tuple[int, int] | None] = None
    ANSWERS_DESCRIPTION: ClassVar[str] = "the answer as written in the dataset ('' if unknown)"
    TARGETS_DESCRIPTION: ClassVar[str] = "index of the answer, -100 when unknown"
    ANSWERS_FROM_TRAINING: ClassVar[bool] = False
    params: Any

    def __init__(self, params: VQAParams, context: BuildContext) -> None:
        super().__init__(params, context)
        size = params.resize or self.NATIVE_SIZE
        assert size is not None, "a reader without a native size defaults `resize`"
        self.height, self.width = int(size[0]), int(size[1])
        if params.normalize is not None and len(params.normalize.mean) not in (1, 3):
            raise ComponentError.at(
                self.where("normalize"),
                self.label,
                f"normalize has {len(params.normalize.mean)} means and stds for RGB images",
                "give 1 or 3",
            )
        # Filled by prepare(); building the task must not touch the disk.
        self._records: list[QARecord] = []
        self._answers: list[str] = []
        self._loaded = False
        self.publish_global("input_depth", 3)
        self.publish_global("input_height", self.height)
        self.publish_global("input_width", self.width)

    def error(self, where: str | Path, message: str, suggestion: str = "") -> DataError:
        return data_error(where, self.label, message, suggestion)

    # ---- streams ----------------------------------------------------------------------------
    def output_specs(self) -> dict[str, StreamSpec]:
        images = "RGB images" + (", standardised" if self.params.normalize else ", in [0, 1]")
        specs = {
            "indices": StreamSpec(
                ("batch",), torch.int64, "position of each question in the split"
            ),
            "images": StreamSpec(("batch", 3, self.height, self.width), torch.float32, images),
            "questions": StreamSpec(("batch",), str, "the question"),
            "answers": StreamSpec(("batch",), str, self.ANSWERS_DESCRIPTION),
            "targets": StreamSpec(("batch",), torch.int64, self.TARGETS_DESCRIPTION),
        }
        for name, description in self.EXTRA_STREAMS.items():
            specs[name] = StreamSpec(("batch",), torch.int64, description)
        return specs

    # ---- data -------------------------------------------------------------------------------
    def _load(self) -> list[QARecord]:
        """Every question of the split, in file order."""
        raise NotImplementedError

    def prepare(self) -> None:
        """Parse the split's question files, once (images are read per sample)."""
        if self._loaded:
            return
        records = self._load()
        subset = self.params.subset
        if subset is not None and subset < len(records):
            generator = torch.Generator().manual_seed(self.params.subset_seed)
            chosen = torch.randperm(len(records), generator=generator)[:subset]
            records = [records[int(i)] for i in chosen.sort().values]
        if self.ANSWERS_FROM_TRAINING:
            self._answers = self._training_answers(records)
            index = {answer: i for i, answer in enumerate(self._answers)}
            for record in records:
                record.target = self._target_of(record.answer, index)
        self._records = records
        self._loaded = True

    # ---- open answer sets -------------------------------------------------------------------
    def _training_records(self) -> list[QARecord]:
        """Every question of the training split of `data_folder` (targets not yet set)."""
        raise NotImplementedError

    def _training_answers(self, records: list[QARecord]) -> list[str]:
        """The sorted answers of the training split: exactly the labels a `LabelIndexer`
        builds from the pipeline's training task, so that its classes are these targets."""
        trainer = self.training_task()
        if trainer is self or (trainer is None and self.params.split == "train"):
            source = records
        elif type(trainer) is type(self):
            assert isinstance(trainer, VQATask)
            source = trainer.records()
        else:  # no training task of this kind: the training split of data_folder
            source = records if self.params.split == "train" else self._training_records()
        return sorted({r.answer for r in source if r.answer})

    def _target_of(self, answer: str, index: dict[str, int]) -> int:
        return index.get(answer, IGNORE_INDEX)

    def answer_vocabulary(self) -> list[str]:
        """The answers `targets` index, in index order (open answer sets only)."""
        self.prepare()
        return list(self._answers)

    def records(self) -> list[QARecord]:
        """The parsed questions of the split (after `subset`)."""
        self.prepare()
        return self._records

    def sample_targets(self) -> torch.Tensor | None:
        """The answer index of every question, for class-balanced sampling; None when some
        are unknown (a test split), which that sampler cannot weigh."""
        targets = torch.tensor([r.target for r in self.records()], dtype=torch.int64)
        return None if bool((targets < 0).any()) else targets

    def __len__(self) -> int:
        return len(self.records())

    def __getitem__(self, index: int) -> Batch:
        records = self.records()
        index = self.checked_index(index, len(records), "questions")
        record = records[index]
        image = read_rgb_image(
            record.image, self.height, self.width, self.params.normalize, self.label
        )
        sample: dict[str, Any] = {
            "indices": index,
            "images": image,
            "questions": record.question,
            "answers": record.answer,
            "targets": record.target,
        }
        for name, value in zip(self.EXTRA_STREAMS, record.extras, strict=True):
            sample[name] = value
        return sample

    def collate(self, samples: list[Batch]) -> Batch:
        """Images stacked, integers as int64 tensors, questions and answers as lists."""
        batch: dict[str, Any] = {
            "images": torch.stack([s["images"] for s in samples]),
            "questions": [s["questions"] for s in samples],
            "answers": [s["answers"] for s in samples],
        }
        for name in ("indices", "targets", *self.EXTRA_STREAMS):
            batch[name] = torch.tensor([s[name] for s in samples], dtype=torch.int64)
        return batch

    def texts(self, stream: str) -> Iterator[Any]:
        """Every question's value of a stream without reading any image (but for `images`)."""
        if stream == "images":
            yield from super().texts(stream)
            return
        records = self.records()
        if stream == "indices":
            yield from range(len(records))
        elif stream == "questions":
            yield from (r.question for r in records)
        elif stream == "answers":
            yield from (r.answer for r in records)
        elif stream == "targets":
            yield from (r.target for r in records)
        elif stream in self.EXTRA_STREAMS:
            position = list(self.EXTRA_STREAMS).index(stream)
            yield from (r.extras[position] for r in records)
        else:
            known = ", ".join(self.output_specs())
            raise KeyError(f"{type(self).__name__} has no stream '{stream}' (it has {known})")
