"""The CLEVR, VQAMed2019 and GQA readers on small data sets written in the real formats
(tests/vqa_fixtures.py): what they read, the targets, the splits without answers, lazy image
reading, and the errors that name the file, the line and where to get the data."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pydantic
import pytest
import torch

from torchloom.core.component import BuildContext
from torchloom.errors import ComponentError, DataError
from torchloom.zoo.tasks.clevr import CLEVR, CLEVR_ANSWERS
from torchloom.zoo.tasks.gqa import GQA
from torchloom.zoo.tasks.vqa_med import VQAMed2019
from vqa_fixtures import COLOURS, write_clevr, write_gqa, write_vqa_med


@pytest.fixture(scope="module")
def clevr(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("CLEVR_v1.0")
    write_clevr(root, {"train": 4, "val": 2, "test": 2})
    return root


@pytest.fixture(scope="module")
def med(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vqa-med")
    write_vqa_med(root, {"train": 3, "validation": 4, "test": 2})
    return root


@pytest.fixture(scope="module")
def gqa(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gqa")
    write_gqa(root, {"train": 3, "val": 4, "test": 1})
    return root


def centre(image: torch.Tensor) -> list[float]:
    return image[:, image.shape[1] // 2, image.shape[2] // 2].tolist()


def unit(colour: str) -> list[float]:
    """A fixture colour as the float32 pixels in [0, 1] a reader gives."""
    return torch.tensor(COLOURS[colour], dtype=torch.float32).div(255).tolist()


# ---- CLEVR ----------------------------------------------------------------------------------
def test_clevr_reads_questions_answers_families_and_images(clevr: Path) -> None:
    task = CLEVR.create(data_folder=str(clevr), split="train")
    assert task.global_value("num_classes") == 28 and task.dimension_sizes() == {"classes": 28}
    assert task.global_value("label_word_mappings")["yes"] == 0
    assert task.global_value("label_word_mappings")["small"] == 27
    assert (task.global_value("input_height"), task.global_value("input_width")) == (320, 480)
    assert len(task) == 12
    sample = task[3]  # image 1 (blue), first question
    assert sample["questions"] == "What color is the big square?"
    assert sample["answers"] == "blue" and sample["targets"] == CLEVR_ANSWERS.index("blue")
    assert sample["question_families"] == 29 and sample["indices"] == 3
    assert sample["images"].shape == (3, 320, 480) and sample["images"].dtype == torch.float32
    # A PNG at its native size: the pixels are exactly the written ones, divided by 255.
    assert centre(sample["images"]) == unit("blue")
    assert [task[i]["targets"] for i in (1, 2)] == [0, CLEVR_ANSWERS.index("1")]
    records = task.records()  # the questions of one image share its path
    assert records[3].image is records[4].image and records[3].image.name.endswith("01.png")


def test_clevr_batches_resize_normalize_and_subset(clevr: Path) -> None:
    normalize = {"mean": [0.5], "std": [0.25]}
    task = CLEVR.create(data_folder=str(clevr), resize=[16, 24], normalize=normalize, subset=5)
    loader = torch.utils.data.DataLoader(task, batch_size=4, collate_fn=task.collate)
    batch = next(iter(loader))
    assert batch["images"].shape == (4, 3, 16, 24)
    assert batch["indices"].tolist() == [0, 1, 2, 3] and batch["targets"].dtype == torch.int64
    assert isinstance(batch["questions"], list) and isinstance(batch["answers"][0], str)
    red = [(v / 255 - 0.5) / 0.25 for v in COLOURS["red"]]
    assert centre(batch["images"][0]) == pytest.approx(red, abs=1e-5)
    again = CLEVR.create(data_folder=str(clevr), subset=5)
    assert len(again) == 5 and list(again.texts("questions")) == batch["questions"] + [
        task[4]["questions"]
    ]
    other = CLEVR.create(data_folder=str(clevr), subset=5, subset_seed=3)
    assert [r.image for r in other.records()] != [r.image for r in again.records()]
    # The spec promises what the batch holds.
    assert task.output_specs()["images"].shape_text() == "[batch, 3, 16, 24]"


def test_clevr_test_split_has_no_answers(clevr: Path) -> None:
    task = CLEVR.create(data_folder=str(clevr), split="test", resize=[8, 8])
    sample = task[0]
    assert (sample["answers"], sample["targets"], sample["question_families"]) == ("", -100, -1)
    assert task.sample_targets() is None
    assert CLEVR.create(data_folder=str(clevr), split="val").sample_targets() is not None


def test_clevr_cogent_layout(tmp_path: Path) -> None:
    root = tmp_path / "CLEVR_CoGenT_v1.0"
    write_clevr(root, {"trainA": 1, "valB": 1, "testB": 1})
    assert CLEVR.create(data_folder=str(root), split="valB")[0]["answers"] == "red"
    assert CLEVR.create(data_folder=str(root), split="testB")[0]["targets"] == -100
    with pytest.raises(DataError) as error:
        CLEVR.create(data_folder=str(root), split="valA").prepare()
    assert "CLEVR_valA_questions.json" in str(error.value)
    assert "CLEVR_CoGenT_v1.0.zip" in str(error.value)


def test_clevr_builds_without_data_and_names_the_layout(tmp_path: Path) -> None:
    task = CLEVR.create(data_folder=str(tmp_path / "nowhere"), split="val")  # reads nothing
    assert task.output_specs()["targets"].dtype_text() == "int64"
    with pytest.raises(DataError) as error:
        len(task)
    message = str(error.value)
    assert "questions/CLEVR_val_questions.json" in message and "images/val/" in message
    assert "https://dl.fbaipublicfiles.com/clevr/CLEVR_v1.0.zip" in message


def test_clevr_missing_image_is_reported_when_read(clevr: Path, tmp_path: Path) -> None:
    root = tmp_path / "clevr"
    shutil.copytree(clevr, root)
    missing = root / "images" / "train" / "CLEVR_train_000001.png"
    missing.unlink()
    task = CLEVR.create(data_folder=str(root))
    assert len(task) == 12  # parsing the questions does not look for images
    assert len(list(task.texts("answers"))) == 12  # nor does reading the texts
    task[0]
    with pytest.raises(DataError) as error:
        task[3]
    assert str(missing) in str(error.value) and "missing" in str(error.value)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"info": {},\n "questions": [', ":2: "),
        ('{"questions": {}}', '"questions": [...]'),
        ('{"questions": [{"image_filename": "a.png"}]}', "question 0 has no str 'question'"),
        # Only the test splits come without answers.
        ('{"questions": [{"image_filename": "a.png", "question": "q"}]}', "no str 'answer'"),
        (
            '{"questions": [{"image_filename": "a.png", "question": "q", "answer": "maybe"}]}',
            "'maybe', which is not one of the 28 CLEVR answers",
        ),
        (
            '{"questions": [{"image_filename": "a.png", "question": "q", "answer": "no", '
            '"question_family_index": 90}]}',
            "question_family_index 90, outside 0-89",
        ),
    ],
)
def test_clevr_malformed_question_files(tmp_path: Path, content: str, expected: str) -> None:
    (tmp_path / "questions").mkdir()
    (tmp_path / "questions" / "CLEVR_train_questions.json").write_text(content)
    with pytest.raises(DataError) as error:
        CLEVR.create(data_folder=str(tmp_path)).prepare()
    assert expected in str(error.value) and "CLEVR_train_questions.json" in str(error.value)


def test_clevr_rejects_bad_parameters() -> None:
    with pytest.raises(pydantic.ValidationError):
        CLEVR.create(split="validation")
    with pytest.raises(pydantic.ValidationError):
        CLEVR.create(resize=[0, 4])
    with pytest.raises(ComponentError, match="normalize has 2 means"):
        CLEVR.create(normalize={"mean": [0.5, 0.5], "std": [1.0, 1.0]})


# ---- VQA-Med 2019 ---------------------------------------------------------------------------
def test_vqa_med_training_split(med: Path) -> None:
    task = VQAMed2019.create(data_folder=str(med), resize=[20, 30])
    assert task.global_value("category_word_mappings") == {"C1": 0, "C2": 1, "C3": 2, "C4": 3}
    assert len(task) == 12  # 3 images, one question per category each, C1 first
    assert list(task.texts("categories")) == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    answers = list(task.texts("answers"))
    vocabulary = sorted(set(answers))
    assert task.answer_vocabulary() == vocabulary
    assert list(task.texts("targets")) == [vocabulary.index(a) for a in answers]
    sample = task[4]
    assert sample["questions"] == "in what plane is this image taken?"
    assert sample["answers"] == "sagittal" and sample["categories"] == 1
    # Images of several sizes come out at one size (a JPEG: colours are close, not exact).
    assert sample["images"].shape == (3, 20, 30)
    assert centre(sample["images"]) == pytest.approx([v / 255 for v in COLOURS["blue"]], abs=0.05)
    batch = task.collate([task[0], task[5]])
    assert batch["categories"].tolist() == [0, 1] and batch["images"].shape == (2, 3, 20, 30)


def test_a_vqa_med_question_with_a_line_separator_in_it_is_one_row(
    med: Path, tmp_path: Path
) -> None:
    import shutil

    copy = tmp_path / "med"
    shutil.copytree(med, copy)
    (path,) = (copy / "ImageClef-2019-VQA-Med-Training" / "QAPairsByCategory").glob("C1*")
    lines = path.read_text(encoding="utf-8").split("\n")
    image, question, answer = lines[0].split("|")
    lines[0] = f"{image}|{question}\u2028(one row)|{answer}"
    path.write_text("\n".join(lines), encoding="utf-8")
    task = VQAMed2019.create(data_folder=str(copy))
    assert len(task) == 12 and "\u2028(one row)" in task[0]["questions"]


def test_vqa_med_categories_and_validation_targets(med: Path) -> None:
    task = VQAMed2019.create(data_folder=str(med), split="validation", categories=["C4", "C2"])
    # Category by category in the order asked, then in file order; 4 validation images.
    assert list(task.texts("categories")) == [3] * 4 + [1] * 4
    training = VQAMed2019.create(data_folder=str(med), categories=["C4", "C2"])
    vocabulary = training.answer_vocabulary()
    assert task.answer_vocabulary() == vocabulary  # read from the training files
    # Image 3 of validation has answers the 3 training images never have: ignored.
    expected = [vocabulary.index(a) if a in vocabulary else -100 for a in task.texts("answers")]
    assert list(task.texts("targets")) == expected and -100 in expected
    assert task.sample_targets() is None


def test_vqa_med_answers_follow_the_pipelines_training_task(med: Path) -> None:
    trainer = VQAMed2019.create(data_folder=str(med), categories=["C1"], subset=2)
    params = VQAMed2019.Params(data_folder=str(med), split="validation")
    task = VQAMed2019(params, BuildContext(name="validation.task", training_task=lambda: trainer))
    vocabulary = trainer.answer_vocabulary()
    assert len(vocabulary) == 2 and task.answer_vocabulary() == vocabulary
    for answer, target in zip(task.texts("answers"), task.texts("targets"), strict=True):
        assert target == (vocabulary.index(answer) if answer in vocabulary else -100)
    # Even another reader of the training split follows the pipeline's training task.
    params = VQAMed2019.Params(data_folder=str(med), split="train")
    other = VQAMed2019(params, BuildContext(name="test.task", training_task=lambda: trainer))
    assert other.answer_vocabulary() == vocabulary and len(other) == 12
    assert -100 in list(other.texts("targets"))


def test_vqa_med_test_split_with_and_without_answers(med: Path, tmp_path: Path) -> None:
    task = VQAMed2019.create(data_folder=str(med), split="test", categories=["C3"])
    assert list(task.texts("answers")) == ["spine and contents", "musculoskeletal"]
    assert list(task.texts("categories")) == [2, 2]
    training = VQAMed2019.create(data_folder=str(med), categories=["C3"]).answer_vocabulary()
    assert list(task.texts("targets")) == [training.index("spine and contents"), -100]
    assert task[0]["images"].shape == (3, 224, 224)

    root = tmp_path / "med"
    shutil.copytree(med, root)
    answers = root / "VQAMed2019Test" / "VQAMed2019_Test_Questions_w_Ref_Answers.txt"
    lines = answers.read_text().splitlines()
    # '#' separates alternative answers: the first the training split knows is the target.
    image, category, question, _ = lines[5].split("|")  # C1, C1, C2, C2, C3, C3, ...
    assert category == "organ"
    lines[5] = f"{image}|{category}|{question}|unknown thing#breast"
    answers.write_text("\n".join(lines) + "\n")
    task = VQAMed2019.create(data_folder=str(root), split="test", categories=["C3"])
    assert list(task.texts("targets"))[1] == training.index("breast")

    # The two test files must list the questions in the same order.
    lines[2], lines[3] = lines[3], lines[2]
    answers.write_text("\n\n".join(lines) + "\n")  # blank lines are skipped, and counted
    with pytest.raises(DataError) as error:
        VQAMed2019.create(data_folder=str(root), split="test").prepare()
    assert f"{answers}:5:" in str(error.value) and "question 3 of" in str(error.value)

    answers.unlink()
    task = VQAMed2019.create(data_folder=str(root), split="test")
    assert len(task) == 8 and set(task.texts("answers")) == {""}
    assert set(task.texts("targets")) == {-100} and set(task.texts("categories")) == {-1}
    with pytest.raises(DataError, match="only it gives the categories"):
        VQAMed2019.create(data_folder=str(root), split="test", categories=["C1"]).prepare()


def test_vqa_med_malformed_line_names_file_and_line(med: Path, tmp_path: Path) -> None:
    root = tmp_path / "med"
    shutil.copytree(med, root)
    path = root / "ImageClef-2019-VQA-Med-Training" / "QAPairsByCategory" / "C2_Plane_train.txt"
    lines = path.read_text().splitlines()
    lines[1] = "synpic1001|in what plane is this image taken?"  # the answer is lost
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as error:
        VQAMed2019.create(data_folder=str(root)).prepare()
    assert f"{path}:2:" in str(error.value)
    assert "expected 3 non-empty fields image_id|question|answer" in str(error.value)
    # The other categories still read.
    assert len(VQAMed2019.create(data_folder=str(root), categories=["C1", "C3"])) == 6


def test_vqa_med_missing_data_names_layout_and_download(tmp_path: Path) -> None:
    task = VQAMed2019.create(data_folder=str(tmp_path), split="validation")
    with pytest.raises(DataError) as error:
        task.prepare()
    message = str(error.value)
    assert "ImageClef-2019-VQA-Med-Validation" in message and "C1_Modality_val.txt" in message
    assert "https://github.com/abachaa/VQA-Med-2019" in message
    with pytest.raises(DataError, match=r"VQAMed2019_Test_Questions\.txt"):
        VQAMed2019.create(data_folder=str(tmp_path), split="test").prepare()
    with pytest.raises(pydantic.ValidationError, match="twice"):
        VQAMed2019.create(categories=["C1", "C1"])
    with pytest.raises(pydantic.ValidationError):
        VQAMed2019.create(categories=["C5"])


# ---- GQA ------------------------------------------------------------------------------------
def test_gqa_reads_questions_types_and_targets(gqa: Path) -> None:
    task = GQA.create(data_folder=str(gqa), split="val", resize=[12, 16])
    assert task.global_value("structural_type_word_mappings")["compare"] == 4
    assert len(task) == 8
    sample = task[2]  # image 1 (blue), first question
    assert (sample["questions"], sample["answers"]) == ("What color is the square?", "blue")
    assert (sample["structural_types"], sample["semantic_types"]) == (1, 1)  # query, attr
    assert task[3]["structural_types"] == 0  # verify
    assert sample["images"].shape == (3, 12, 16)
    training = GQA.create(data_folder=str(gqa)).answer_vocabulary()
    assert training == ["blue", "green", "no", "red", "yes"]
    assert list(task.texts("targets")) == [
        training.index(a) if a in training else -100 for a in task.texts("answers")
    ]
    test = GQA.create(data_folder=str(gqa), split="test")
    assert [test[0][k] for k in ("answers", "targets", "structural_types")] == ["", -100, -1]


def test_gqa_files_at_the_root_and_the_all_version(gqa: Path, tmp_path: Path) -> None:
    root = tmp_path / "gqa"
    shutil.copytree(gqa, root)
    # The questions zip extracted straight into data_folder.
    for path in (root / "questions1.2").iterdir():
        path.rename(root / path.name)
    assert len(GQA.create(data_folder=str(root), split="val")) == 8
    # version all: the training questions come in numbered parts.
    train = json.loads((root / "train_balanced_questions.json").read_text())
    parts = root / "questions1.2" / "train_all_questions"
    parts.mkdir(parents=True)
    items = list(train.items())
    for number, chunk in enumerate((items[:2], items[2:4], items[4:])):
        (parts / f"train_all_questions_{number}.json").write_text(json.dumps(dict(chunk)))
    (parts / "train_all_questions_10.json").write_text("{}")  # after _2, not after _1
    task = GQA.create(data_folder=str(root), version="all")
    assert list(task.texts("questions")) == [item["question"] for _, item in items]


def test_gqa_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError) as error:
        GQA.create(data_folder=str(tmp_path), split="testdev").prepare()
    message = str(error.value)
    assert "questions1.2/testdev_balanced_questions.json" in message
    assert "https://downloads.cs.stanford.edu/nlp/data/gqa/images.zip" in message
    folder = tmp_path / "questions1.2"
    folder.mkdir()
    path = folder / "train_balanced_questions.json"
    path.write_text(
        json.dumps(
            {"1": {"imageId": "n1", "question": "q", "answer": "a", "types": {"structural": "x"}}}
        )
    )
    with pytest.raises(DataError, match="question '1' has the structural type 'x'"):
        GQA.create(data_folder=str(tmp_path)).prepare()
    path.write_text(json.dumps({"3": {"imageId": "n1", "question": "q"}}))
    with pytest.raises(DataError, match="question '3' has no text 'answer'"):
        GQA.create(data_folder=str(tmp_path)).prepare()
    path.write_text(json.dumps({"7": {"question": "q"}}))
    with pytest.raises(DataError, match="question '7' has no text 'imageId'"):
        GQA.create(data_folder=str(tmp_path)).prepare()
    path.write_text("[]")
    with pytest.raises(DataError, match="JSON object of question id"):
        GQA.create(data_folder=str(tmp_path)).prepare()
