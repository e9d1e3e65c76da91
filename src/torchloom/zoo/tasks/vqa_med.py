"""The VQAMed2019 task: ImageCLEF 2019 medical VQA, read from its pipe-separated files."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from torchloom.core.component import BuildContext
from torchloom.zoo.tasks.vqa_common import (
    IGNORE_INDEX,
    UNKNOWN,
    VQA_GLOBALS,
    ImagePaths,
    QARecord,
    Size2D,
    VQAParams,
    VQATask,
)

Category = Literal["C1", "C2", "C3", "C4"]
# The question categories of VQA-Med 2019, in index order: the file-name stem of each (as in
# QAPairsByCategory/C1_Modality_train.txt) and the word the test answers file uses.
CATEGORIES: dict[str, tuple[str, str]] = {
    "C1": ("C1_Modality", "modality"),
    "C2": ("C2_Plane", "plane"),
    "C3": ("C3_Organ", "organ"),
    "C4": ("C4_Abnormality", "abnormality"),
}
CATEGORY_OF_WORD = {word: index for index, (_, word) in enumerate(CATEGORIES.values())}
# Each split's folder, file-name suffix and image folder, as in the official zip files.
SPLIT_FOLDERS = {
    "train": ("ImageClef-2019-VQA-Med-Training", "train", "Train_images"),
    "validation": ("ImageClef-2019-VQA-Med-Validation", "val", "Val_images"),
}
# The test set's folder: VQAMed2019Test in the dataset's GitHub repository, the name
# PyTorchPipe used otherwise; the first that exists is read.
TEST_FOLDERS = ("VQAMed2019Test", "ImageClef-2019-VQA-Med-Test")
TEST_QUESTIONS = "VQAMed2019_Test_Questions.txt"
TEST_ANSWERS = "VQAMed2019_Test_Questions_w_Ref_Answers.txt"
TEST_IMAGES = "VQAMed2019_Test_Images"
DOWNLOAD = (
    "https://github.com/abachaa/VQA-Med-2019 (the training and validation zip files and "
    "VQAMed2019Test/), also at https://zenodo.org/records/10499039"
)
LAYOUT = (
    "data_folder should hold the extracted ImageClef-2019-VQA-Med-Training/ "
    "(QAPairsByCategory/C1_Modality_train.txt ... C4_Abnormality_train.txt, Train_images/), "
    "ImageClef-2019-VQA-Med-Validation/ (QAPairsByCategory/C1_Modality_val.txt ..., "
    f"Val_images/) and VQAMed2019Test/ ({TEST_QUESTIONS}, {TEST_ANSWERS}, {TEST_IMAGES}/), "
    f"from {DOWNLOAD}"
)


class VQAMed2019Params(VQAParams):
    data_folder: str = Field(
        "~/data/vqa-med-2019",
        description="Folder holding the extracted ImageClef-2019-VQA-Med-Training/, "
        "ImageClef-2019-VQA-Med-Validation/ and VQAMed2019Test/ folders; `~` is expanded.",
    )
    split: Literal["train", "validation", "test"] = Field(
        "train", description="train (12,792 questions), validation (2,000) or test (500)."
    )
    categories: list[Category] = Field(
        ["C1", "C2", "C3", "C4"],
        min_length=1,
        description="Question categories to read: C1 modality, C2 plane, C3 organ system, "
        "C4 abnormality.",
    )
    resize: Size2D = Field(
        [224, 224],
        description="[height, width] every image is resized to (bilinear) when read; the "
        "radiology images have many sizes, so batches need one.",
    )

    @field_validator("categories")
    @classmethod
    def _no_repeats(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("lists a category twice")
        return value


class VQAMed2019(VQATask):
    """VQA-Med 2019 (ImageCLEF; Ben Abacha et al. 2019): questions about radiology images.

    Reads the dataset as published from `data_folder`: for the training and validation
    splits, `ImageClef-2019-VQA-Med-Training/QAPairsByCategory/C1_Modality_train.txt`,
    `C2_Plane_train.txt`, `C3_Organ_train.txt`, `C4_Abnormality_train.txt` (lines
    `image_id|question|answer`) and the images `Train_images/<image_id>.jpg`
    (`ImageClef-2019-VQA-Med-Validation/`, `*_val.txt` and `Val_images/` likewise); for the
    test split, `VQAMed2019Test/VQAMed2019_Test_Questions.txt` (`image_id|question`) with the
    answers and categories taken from `VQAMed2019_Test_Questions_w_Ref_Answers.txt`
    (`image_id|category|question|answer`) when it is there, and the images in
    `VQAMed2019_Test_Images/`. Questions come category by category, in `categories` order,
    then in file order. A line that does not have its fields is an error naming the file and
    line.

    The answers are open, so `targets` index the sorted answers of the training split: those
    of the pipeline's training task when it is a VQAMed2019 task (so that they agree with a
    classifier sized on it, e.g. by a `LabelIndexer` on its `answers`), else those of the
    training files in `data_folder` for the same categories. An answer outside them (and a
    test question without answers) has target -100, which losses and accuracies ignore. A
    test answer listing alternatives (`a#b`) is the first of them the training split knows.

    Building the task reads nothing; `prepare()` parses the text files, and each image is read
    and resized (`resize`, default 224x224) only when its question is asked for.

    Streams, per batch: `indices`, `images` ([batch, 3, height, width] float32), `questions`
    (str), `answers` (str), `targets` (int64), `categories` (0 modality/C1, 1 plane/C2,
    2 organ/C3, 3 abnormality/C4; -1 when unknown). Publishes `input_depth`, `input_height`,
    `input_width`, `num_categories` (4) and `category_word_mappings` ({"C1": 0, ...}).

    ```yaml
    training:
      task:
        type: VQAMed2019
        data_folder: ~/data/vqa-med-2019
        split: train
        categories: [C1, C2, C3]
        resize: [224, 224]
        normalize: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}
    ```
    """

    Params = VQAMed2019Params
    params: VQAMed2019Params
    PUBLISHES_GLOBALS = {
        **VQA_GLOBALS,
        "num_categories": "number of question categories (4)",
        "category_word_mappings": "category (C1-C4) -> index of the `categories` stream",
    }
    EXTRA_STREAMS = {
        "categories": "question category: 0 modality (C1), 1 plane (C2), 2 organ system (C3), "
        "3 abnormality (C4); -1 when unknown"
    }
    ANSWERS_FROM_TRAINING = True
    TARGETS_DESCRIPTION = "index of the answer among the training split's, -100 when unknown"

    def __init__(self, params: VQAMed2019Params, context: BuildContext) -> None:
        super().__init__(params, context)
        self.data_folder = Path(params.data_folder).expanduser()
        self.publish_global("num_categories", len(CATEGORIES))
        self.publish_global("category_word_mappings", {c: i for i, c in enumerate(CATEGORIES)})

    # ---- reading ----------------------------------------------------------------------------
    def _load(self) -> list[QARecord]:
        if self.params.split == "test":
            return self._read_test()
        return self._read_split(self.params.split)

    def _training_records(self) -> list[QARecord]:
        return self._read_split("train")

    def _read_split(self, split: str) -> list[QARecord]:
        folder_name, suffix, image_folder = SPLIT_FOLDERS[split]
        folder = self.data_folder / folder_name
        if not folder.is_dir():
            raise self.error(folder, f"the {split} folder is missing; {LAYOUT}")
        images = ImagePaths(folder / image_folder)
        records = []
        for category in self.params.categories:
            stem, _ = CATEGORIES[category]
            path = folder / "QAPairsByCategory" / f"{stem}_{suffix}.txt"
            if not path.is_file():
                raise self.error(path, f"the {category} question file is missing; {LAYOUT}")
            index = list(CATEGORIES).index(category)
            for _, (image_id, question, answer) in self._lines(
                path, ("image_id", "question", "answer")
            ):
                records.append(
                    QARecord(images(f"{image_id}.jpg"), question, answer, IGNORE_INDEX, (index,))
                )
        return records

    def _read_test(self) -> list[QARecord]:
        folder = self._test_folder()
        images = ImagePaths(folder / TEST_IMAGES)
        questions = [
            row for _, row in self._lines(folder / TEST_QUESTIONS, ("image_id", "question"))
        ]
        answers_path = folder / TEST_ANSWERS
        wanted = {list(CATEGORIES).index(c) for c in self.params.categories}
        if not answers_path.is_file():
            if len(wanted) < len(CATEGORIES):
                raise self.error(
                    answers_path,
                    "is missing, and only it gives the categories of the test questions, so "
                    "`categories` cannot select some of them",
                    f"add it from {DOWNLOAD}, or read every category",
                )
            return [
                QARecord(images(f"{image_id}.jpg"), question, "", IGNORE_INDEX, (UNKNOWN,))
                for image_id, question in questions
            ]
        fields = ("image_id", "category", "question", "answer")
        answered = self._lines(answers_path, fields)
        if len(answered) != len(questions):
            raise self.error(
                answers_path,
                f"has {len(answered)} answers for the {len(questions)} questions of "
                f"{TEST_QUESTIONS}",
            )
        records = []
        for number, ((image_id, question), (line, (answer_image, word, _, answer))) in enumerate(
            zip(questions, answered, strict=True), start=1
        ):
            if answer_image != image_id:
                raise self.error(
                    f"{answers_path}:{line}",
                    f"answers image '{answer_image}', but question {number} of {TEST_QUESTIONS} "
                    f"asks about image '{image_id}'",
                    "the two files must list the questions in the same order",
                )
            category = CATEGORY_OF_WORD.get(word.lower())
            if category is None:
                raise self.error(
                    f"{answers_path}:{line}",
                    f"unknown category '{word}' (expected {', '.join(CATEGORY_OF_WORD)})",
                )
            if category in wanted:
                records.append(
                    QARecord(images(f"{image_id}.jpg"), question, answer, IGNORE_INDEX, (category,))
                )
        return records

    def _test_folder(self) -> Path:
        for name in TEST_FOLDERS:
            folder = self.data_folder / name
            if (folder / TEST_QUESTIONS).is_file():
                return folder
        raise self.error(
            self.data_folder / TEST_FOLDERS[0] / TEST_QUESTIONS,
            f"the test question file is missing; {LAYOUT}",
        )

    def _lines(self, path: Path, fields: tuple[str, ...]) -> list[tuple[int, tuple[str, ...]]]:
        """(line number, values) of every non-empty line of a pipe-separated file, each split
        into `fields`."""
        try:
            text = path.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as error:
            raise self.error(path, f"cannot be read: {error}") from error
        rows = []
        # Lines end at "\n" alone (as text_sources.read_lines): `splitlines` also ends one at
        # a form feed or U+2028 inside a question, whose row then had too few fields.
        for number, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            values = tuple(value.strip() for value in line.split("|"))
            if len(values) != len(fields) or not all(values):
                raise self.error(
                    f"{path}:{number}",
                    f"expected {len(fields)} non-empty fields {'|'.join(fields)}, found "
                    f"{line.strip()!r}",
                    "is this file from VQA-Med 2019?",
                )
            rows.append((number, values))
        if not rows:
            raise self.error(path, "holds no questions")
        return rows

    def _target_of(self, answer: str, index: dict[str, int]) -> int:
        if answer in index:
            return index[answer]
        # The test answers mark alternatives with '#': any of them is right.
        for alternative in answer.split("#"):
            if alternative.strip() in index:
                return index[alternative.strip()]
        return IGNORE_INDEX
