"""The GQA task: compositional questions about real-world images, read from the GQA files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

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

# GQA's question types (Hudson & Manning 2019), in index order.
STRUCTURAL_TYPES = ("verify", "query", "choose", "logical", "compare")
SEMANTIC_TYPES = ("obj", "attr", "cat", "rel", "global")
QUESTIONS_URL = "https://downloads.cs.stanford.edu/nlp/data/gqa/questions1.2.zip"
IMAGES_URL = "https://downloads.cs.stanford.edu/nlp/data/gqa/images.zip"
HOME_PAGE = "https://cs.stanford.edu/people/dorarad/gqa/download.html"
QUESTIONS_FOLDER = "questions1.2"
ANSWERED_SPLITS = ("train", "val", "testdev")
LAYOUT = (
    f"data_folder should hold {QUESTIONS_FOLDER}/<split>_<version>_questions.json (the "
    f"extracted {QUESTIONS_URL}; train_all_questions/ for train with version all) and "
    f"images/<imageId>.jpg (the extracted {IMAGES_URL}); see {HOME_PAGE}"
)

Split = Literal["train", "val", "testdev", "test", "challenge", "submission"]


class GQAParams(VQAParams):
    data_folder: str = Field(
        "~/data/gqa",
        description="Folder holding questions1.2/ (the question files; or those files "
        "directly) and images/; `~` is expanded.",
    )
    split: Split = Field(
        "train",
        description="train, val, testdev, test, challenge or submission (the last three have "
        "no answers).",
    )
    version: Literal["balanced", "all"] = Field(
        "balanced",
        description="balanced: the <split>_balanced_questions.json files (1.7M questions, the "
        "usual benchmark); all: <split>_all_questions.json (22M; train in 10 files of "
        "train_all_questions/).",
    )
    resize: Size2D = Field(
        [224, 224],
        description="[height, width] every image is resized to (bilinear) when read; the "
        "images have many sizes, so batches need one.",
    )


class GQA(VQATask):
    """GQA (Hudson & Manning 2019): compositional questions about Visual Genome images.

    Reads the dataset as published from `data_folder`:
    `questions1.2/<split>_balanced_questions.json` (or `_all_`; the files may also lie
    directly in `data_folder`), a JSON object of question id -> `{"imageId", "question",
    "answer", "fullAnswer", "types": {"structural", "semantic", "detailed"}, ...}`, and the
    images `images/<imageId>.jpg`. Questions keep the file's order. The test, challenge and
    submission splits have no answers: their `answers` are '' and their `targets` -100.

    The answers are open, so `targets` index the sorted answers of the training split: those
    of the pipeline's training task when it is a GQA task (so that they agree with a
    classifier sized on it, e.g. by a `LabelIndexer` on its `answers`), else those of the
    training file of the same `version` in `data_folder`. An answer outside them has target
    -100, which losses and accuracies ignore.

    Building the task reads nothing; `prepare()` parses the question file, and each image is
    read and resized (`resize`, default 224x224) only when its question is asked for.

    Streams, per batch: `indices`, `images` ([batch, 3, height, width] float32), `questions`
    (str), `answers` (str), `targets` (int64), `structural_types` (0 verify, 1 query,
    2 choose, 3 logical, 4 compare) and `semantic_types` (0 obj, 1 attr, 2 cat, 3 rel,
    4 global), -1 when the split has none. Publishes `input_depth`, `input_height`,
    `input_width`, `structural_type_word_mappings` and `semantic_type_word_mappings`.

    ```yaml
    training:
      task: {type: GQA, data_folder: ~/data/gqa, split: train, resize: [224, 224]}
    validation:
      task: {type: GQA, data_folder: ~/data/gqa, split: testdev, resize: [224, 224]}
    ```
    """

    Params = GQAParams
    params: GQAParams
    PUBLISHES_GLOBALS = {
        **VQA_GLOBALS,
        "structural_type_word_mappings": "structural type -> index of `structural_types`",
        "semantic_type_word_mappings": "semantic type -> index of `semantic_types`",
    }
    EXTRA_STREAMS = {
        "structural_types": "structural type: 0 verify, 1 query, 2 choose, 3 logical, "
        "4 compare; -1 when unknown",
        "semantic_types": "semantic type: 0 obj, 1 attr, 2 cat, 3 rel, 4 global; -1 when unknown",
    }
    ANSWERS_FROM_TRAINING = True
    TARGETS_DESCRIPTION = "index of the answer among the training split's, -100 when unknown"

    def __init__(self, params: GQAParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.data_folder = Path(params.data_folder).expanduser()
        self.publish_global(
            "structural_type_word_mappings", {t: i for i, t in enumerate(STRUCTURAL_TYPES)}
        )
        self.publish_global(
            "semantic_type_word_mappings", {t: i for i, t in enumerate(SEMANTIC_TYPES)}
        )

    # ---- reading ----------------------------------------------------------------------------
    def _load(self) -> list[QARecord]:
        return self._read_split(self.params.split)

    def _training_records(self) -> list[QARecord]:
        return self._read_split("train")

    def _question_files(self, split: str) -> list[Path]:
        version = self.params.version
        for folder in (self.data_folder / QUESTIONS_FOLDER, self.data_folder):
            single = folder / f"{split}_{version}_questions.json"
            if single.is_file():
                return [single]
            parts = folder / f"{split}_{version}_questions"
            # train_all_questions/train_all_questions_0.json ... _9.json, in number order.
            if parts.is_dir():
                files = sorted(
                    parts.glob(f"{split}_{version}_questions_*.json"),
                    key=lambda p: (len(p.stem), p.stem),
                )
                if files:
                    return files
        expected = self.data_folder / QUESTIONS_FOLDER / f"{split}_{version}_questions.json"
        raise self.error(expected, f"the {split} question file is missing; {LAYOUT}")

    def _read_split(self, split: str) -> list[QARecord]:
        images = ImagePaths(self.data_folder / "images")
        records = []
        for path in self._question_files(split):
            for question_id, item in self._read_json(path).items():
                records.append(self._record(split, path, str(question_id), item, images))
        if not records:
            raise self.error(self._question_files(split)[0], "holds no questions")
        return records

    def _read_json(self, path: Path) -> dict[str, Any]:
        try:
            with path.open(encoding="utf-8") as file:
                content = json.load(file)
        except json.JSONDecodeError as error:
            raise self.error(f"{path}:{error.lineno}", f"is not valid JSON: {error.msg}") from error
        except (OSError, UnicodeDecodeError) as error:
            raise self.error(path, f"cannot be read: {error}") from error
        if not isinstance(content, dict):
            raise self.error(
                path,
                "is not a GQA question file: it should hold a JSON object of question id -> "
                '{"imageId", "question", "answer", "types", ...}',
                LAYOUT,
            )
        return content

    def _record(
        self, split: str, path: Path, question_id: str, item: Any, images: ImagePaths
    ) -> QARecord:
        def text(key: str, required: bool) -> str:
            value = item.get(key) if isinstance(item, dict) else None
            if value is None and not required:
                return ""
            if not isinstance(value, str) or not value:
                raise self.error(
                    path,
                    f"question '{question_id}' has no text '{key}'",
                    'each question should be {"imageId", "question", "answer", ...}',
                )
            return value

        image_id, question = text("imageId", True), text("question", True)
        # Only the test, challenge and submission splits come without answers.
        answer = text("answer", split in ANSWERED_SPLITS)
        types = item.get("types") or {}
        extras = (
            self._type_index(path, question_id, types, "structural"),
            self._type_index(path, question_id, types, "semantic"),
        )
        return QARecord(images(f"{image_id}.jpg"), question, answer, IGNORE_INDEX, extras)

    def _type_index(self, path: Path, question_id: str, types: Any, kind: str) -> int:
        known = STRUCTURAL_TYPES if kind == "structural" else SEMANTIC_TYPES
        value = types.get(kind) if isinstance(types, dict) else None
        if value is None:
            return UNKNOWN
        if value not in known:
            raise self.error(
                path,
                f"question '{question_id}' has the {kind} type {value!r}, not one of "
                f"{', '.join(known)}",
            )
        return known.index(value)
