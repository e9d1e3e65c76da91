"""The CLEVR task: questions about rendered 3D scenes, read from the CLEVR v1.0 files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from torchloom.core.component import BuildContext
from torchloom.errors import DataError
from torchloom.zoo.tasks.vqa_common import (
    IGNORE_INDEX,
    UNKNOWN,
    VQA_GLOBALS,
    ImagePaths,
    QARecord,
    VQAParams,
    VQATask,
)

# The 28 answers of CLEVR (Johnson et al. 2017): yes/no, the counts 0-10, the 8 colours, 2
# materials, 3 shapes and 2 sizes. Target i is CLEVR_ANSWERS[i]; the order is fixed here so that
# a model's outputs mean the same on every machine and split.
CLEVR_ANSWERS: tuple[str, ...] = (
    *("yes", "no"),
    *(str(count) for count in range(11)),
    *("blue", "brown", "cyan", "gray", "green", "purple", "red", "yellow"),
    *("metal", "rubber"),
    *("cube", "cylinder", "sphere"),
    *("large", "small"),
)
# Question families are 0..89: 90 program templates, shared by CLEVR and CoGenT.
NUM_QUESTION_FAMILIES = 90
CLEVR_URL = "https://dl.fbaipublicfiles.com/clevr/CLEVR_v1.0.zip"
COGENT_URL = "https://dl.fbaipublicfiles.com/clevr/CLEVR_CoGenT_v1.0.zip"
HOME_PAGE = "https://cs.stanford.edu/people/jcjohns/clevr/"
COGENT_SPLITS = ("trainA", "valA", "valB", "testA", "testB")

Split = Literal["train", "val", "test", "trainA", "valA", "valB", "testA", "testB"]


class CLEVRParams(VQAParams):
    data_folder: str = Field(
        "~/data/CLEVR_v1.0",
        description="The extracted CLEVR_v1.0 folder (or CLEVR_CoGenT_v1.0 for the CoGenT "
        "splits), holding questions/CLEVR_<split>_questions.json and images/<split>/; `~` is "
        "expanded.",
    )
    split: Split = Field(
        "train",
        description="train, val, test (CLEVR v1.0) or trainA, valA, valB, testA, testB "
        "(CoGenT); test splits have no answers.",
    )


class CLEVR(VQATask):
    """CLEVR (Johnson et al. 2017): questions about rendered scenes of simple 3D objects.

    Reads the dataset as published, from `data_folder`:
    `questions/CLEVR_<split>_questions.json` (`{"info": ..., "questions": [{"image_filename",
    "question", "answer", "question_family_index", "program", ...}]}`) and the 480x320 PNG
    scenes in `images/<split>/`. The CoGenT variant (`CLEVR_CoGenT_v1.0`, splits trainA, valA,
    valB, testA, testB) has the same layout. Questions keep the file's order; the test splits
    have no answers, so their `answers` are '' and their `targets` -100 (ignored by losses and
    accuracies).

    Building the task reads nothing; the question file is parsed by `prepare()` and each image
    is read, converted to RGB and resized (`resize`, default the native 320x480) only when its
    question is asked for. A missing question file is an error naming the layout and where to
    download it; a missing image is an error naming the file.

    Streams, per batch: `indices` (position in the split), `images` ([batch, 3, height,
    width] float32), `questions` (str), `answers` (str), `targets` (index of the answer among
    the 28 CLEVR answers, int64), `question_families` (`question_family_index`, 0-89; -1 when
    the split has none). Publishes `input_depth`, `input_height`, `input_width`, `num_classes`
    (28), `label_word_mappings` (answer -> index) and `num_question_families` (90).

    ```yaml
    training:
      task: {type: CLEVR, data_folder: ~/data/CLEVR_v1.0, split: train, resize: [128, 128]}
    validation:
      task: {type: CLEVR, data_folder: ~/data/CLEVR_v1.0, split: val, resize: [128, 128],
             subset: 5000}
    ```
    """

    Params = CLEVRParams
    params: CLEVRParams
    PUBLISHES_GLOBALS = {
        **VQA_GLOBALS,
        "num_classes": "number of CLEVR answers (28)",
        "label_word_mappings": "answer -> target index",
        "num_question_families": "number of CLEVR question families (90)",
    }
    EXTRA_STREAMS = {
        "question_families": "question_family_index of the question (0-89), -1 when unknown"
    }
    NATIVE_SIZE = (320, 480)
    TARGETS_DESCRIPTION = "index of the answer among the 28 CLEVR answers, -100 when unknown"

    def __init__(self, params: CLEVRParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self.data_folder = Path(params.data_folder).expanduser()
        self.publish_global("num_classes", len(CLEVR_ANSWERS))
        self.publish_global("label_word_mappings", {a: i for i, a in enumerate(CLEVR_ANSWERS)})
        self.publish_global("num_question_families", NUM_QUESTION_FAMILIES)

    def dimension_sizes(self) -> dict[str, int]:
        return {"classes": len(CLEVR_ANSWERS)}

    def _layout(self) -> str:
        split = self.params.split
        if split in COGENT_SPLITS:
            name, url = "CLEVR_CoGenT_v1.0", COGENT_URL
        else:
            name, url = "CLEVR_v1.0", CLEVR_URL
        return (
            f"data_folder should be the extracted {name} folder, holding "
            f"questions/CLEVR_{split}_questions.json and images/{split}/CLEVR_{split}_NNNNNN.png "
            f"(download {url}, from {HOME_PAGE})"
        )

    def _load(self) -> list[QARecord]:
        split = self.params.split
        path = self.data_folder / "questions" / f"CLEVR_{split}_questions.json"
        if not path.is_file():
            raise self.error(path, f"the question file is missing; {self._layout()}")
        questions = self._read_questions(path)
        images = ImagePaths(self.data_folder / "images" / split)
        answers = {answer: index for index, answer in enumerate(CLEVR_ANSWERS)}
        records = []
        for number, item in enumerate(questions):
            image = _field(item, "image_filename", str, path, number, self)
            question = _field(item, "question", str, path, number, self)
            answer = ""
            target = IGNORE_INDEX
            if not split.startswith("test") or "answer" in item:
                answer = _field(item, "answer", str, path, number, self)
                if answer not in answers:
                    raise self.error(
                        path,
                        f"question {number} has the answer '{answer}', which is not one of the "
                        f"28 CLEVR answers ({', '.join(CLEVR_ANSWERS)})",
                        "is this a CLEVR question file?",
                    )
                target = answers[answer]
            family = UNKNOWN
            if "question_family_index" in item:
                family = _field(item, "question_family_index", int, path, number, self)
                if not 0 <= family < NUM_QUESTION_FAMILIES:
                    raise self.error(
                        path,
                        f"question {number} has question_family_index {family}, outside 0-89",
                    )
            records.append(QARecord(images(image), question, answer, target, (family,)))
        if not records:
            raise self.error(path, "the question file holds no questions")
        return records

    def _read_questions(self, path: Path) -> list[Any]:
        try:
            with path.open(encoding="utf-8") as file:
                content = json.load(file)
        except json.JSONDecodeError as error:
            raise self.error(
                f"{path}:{error.lineno}", f"is not valid JSON: {error.msg}", self._layout()
            ) from error
        except (OSError, UnicodeDecodeError) as error:
            raise self.error(path, f"cannot be read: {error}") from error
        questions = content.get("questions") if isinstance(content, dict) else None
        if not isinstance(questions, list):
            raise self.error(
                path,
                'is not a CLEVR question file: it should hold {"info": ..., "questions": [...]}',
                self._layout(),
            )
        return questions


def _field(item: Any, key: str, kind: type, path: Path, number: int, task: CLEVR) -> Any:
    """`item[key]`, checked to be of `kind`; a DataError naming the file and question if not."""
    value = item.get(key) if isinstance(item, dict) else None
    # bool is an int subclass, and never a family index.
    if not isinstance(value, kind) or isinstance(value, bool):
        found = "missing" if value is None else f"a {type(value).__name__}"
        error: DataError = task.error(
            path, f"question {number} has no {kind.__name__} '{key}' ({found})", task._layout()
        )
        raise error
    return value
