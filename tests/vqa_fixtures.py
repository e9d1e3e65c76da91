"""Small CLEVR, VQA-Med 2019 and GQA data sets written in the real on-disk formats, and a tiny
GloVe file, for the VQA reader and pipeline tests (none of these data sets exists offline).

Every writer is deterministic and returns what it wrote, so tests can compare the readers'
output with it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

COLOURS = {"red": (200, 30, 30), "blue": (30, 30, 200), "green": (30, 180, 30)}


def write_picture(path: Path, colour: str, size: tuple[int, int], fmt: str) -> None:
    """A grey picture of `size` (width, height) with a `colour` square in its middle."""
    width, height = size
    pixels = np.full((height, width, 3), 120, dtype=np.uint8)
    pixels[height // 4 : 3 * height // 4, width // 4 : 3 * width // 4] = COLOURS[colour]
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, format=fmt)


# ---- CLEVR ----------------------------------------------------------------------------------
def clevr_questions(split: str, images: int) -> list[dict[str, object]]:
    """Three questions per image, as in CLEVR's files (test splits carry no answers)."""
    colours = list(COLOURS)
    questions: list[dict[str, object]] = []
    for image in range(images):
        colour = colours[image % len(colours)]
        asked = [
            ("What color is the big square?", colour, 29),
            ("Is there a square?", "yes", 36),
            ("How many squares are there?", "1", 40),
        ]
        for text, answer, family in asked:
            item: dict[str, object] = {
                "image_index": image,
                "image_filename": f"CLEVR_{split}_{image:06d}.png",
                "question_index": len(questions),
                "question": text,
                "split": split,
            }
            if not split.startswith("test"):
                item["answer"] = answer
                item["question_family_index"] = family
                item["program"] = [{"inputs": [], "function": "scene", "value_inputs": []}]
            questions.append(item)
    return questions


def write_clevr(
    root: Path, splits: dict[str, int], size: tuple[int, int] = (480, 320)
) -> dict[str, list[dict[str, object]]]:
    """CLEVR_v1.0's layout under `root`: {split: number of images}; returns the questions."""
    written = {}
    colours = list(COLOURS)
    for split, images in splits.items():
        questions = clevr_questions(split, images)
        content = {
            "info": {"split": split, "license": "CC BY 4.0", "version": "1.0", "date": "2/14/2017"},
            "questions": questions,
        }
        (root / "questions").mkdir(parents=True, exist_ok=True)
        path = root / "questions" / f"CLEVR_{split}_questions.json"
        path.write_text(json.dumps(content), encoding="utf-8")
        for image in range(images):
            name = f"CLEVR_{split}_{image:06d}.png"
            write_picture(root / "images" / split / name, colours[image % 3], size, "PNG")
        written[split] = questions
    return written


# ---- VQA-Med 2019 ---------------------------------------------------------------------------
MED_QUESTIONS = {
    "C1": ("what modality is shown?", ["ct noncontrast", "mr - flair", "xr - plain film", "yes"]),
    "C2": ("in what plane is this image taken?", ["axial", "sagittal", "coronal", "pa"]),
    "C3": (
        "what organ system is shown in this image?",
        ["skull and contents", "breast", "spine and contents", "musculoskeletal"],
    ),
    "C4": ("what is abnormal in the image?", ["meningioma", "lipoma", "fracture", "glioma"]),
}
# Answer i of image j of a split is answers[(j + offset) % 4]: with 3 training images, the
# validation and test splits ask questions whose answers the training split never gives.
MED_OFFSETS = {"train": 0, "validation": 1, "test": 2}
MED_FILES = {"C1": "C1_Modality", "C2": "C2_Plane", "C3": "C3_Organ", "C4": "C4_Abnormality"}
MED_WORDS = {"C1": "modality", "C2": "plane", "C3": "organ", "C4": "abnormality"}
MED_SPLITS = {
    "train": ("ImageClef-2019-VQA-Med-Training", "train", "Train_images"),
    "validation": ("ImageClef-2019-VQA-Med-Validation", "val", "Val_images"),
}


def med_lines(split: str, images: int) -> dict[str, list[tuple[str, str, str]]]:
    """{category: [(image_id, question, answer)]}: one question per category per image."""
    rows: dict[str, list[tuple[str, str, str]]] = {c: [] for c in MED_QUESTIONS}
    first = {"train": 1000, "validation": 2000, "test": 3000}[split]
    for image in range(images):
        image_id = f"synpic{first + image}"
        for category, (question, answers) in MED_QUESTIONS.items():
            answer = answers[(image + MED_OFFSETS[split]) % len(answers)]
            rows[category].append((image_id, question, answer))
    return rows


def write_vqa_med(
    root: Path, splits: dict[str, int], test_answers: bool = True
) -> dict[str, dict[str, list[tuple[str, str, str]]]]:
    """The ImageCLEF 2019 VQA-Med layout under `root`: {split: images}; returns the lines."""
    written = {}
    colours = list(COLOURS)
    for split, images in splits.items():
        rows = med_lines(split, images)
        written[split] = rows
        if split == "test":
            folder = root / "VQAMed2019Test"
            folder.mkdir(parents=True, exist_ok=True)
            # The test files list the questions image by image, category by category.
            ordered = [(c, row) for c, category_rows in rows.items() for row in category_rows]
            (folder / "VQAMed2019_Test_Questions.txt").write_text(
                "".join(f"{i}|{q}\n" for _, (i, q, _) in ordered), encoding="utf-8"
            )
            if test_answers:
                (folder / "VQAMed2019_Test_Questions_w_Ref_Answers.txt").write_text(
                    "".join(f"{i}|{MED_WORDS[c]}|{q}|{a}\n" for c, (i, q, a) in ordered),
                    encoding="utf-8",
                )
            image_folder = folder / "VQAMed2019_Test_Images"
        else:
            name, suffix, images_name = MED_SPLITS[split]
            folder = root / name
            (folder / "QAPairsByCategory").mkdir(parents=True, exist_ok=True)
            for category, category_rows in rows.items():
                path = folder / "QAPairsByCategory" / f"{MED_FILES[category]}_{suffix}.txt"
                path.write_text("".join(f"{i}|{q}|{a}\n" for i, q, a in category_rows))
            every = [row for category_rows in rows.values() for row in category_rows]
            (folder / f"All_QA_Pairs_{suffix}.txt").write_text(
                "".join(f"{i}|{q}|{a}\n" for i, q, a in every)
            )
            (folder / f"{suffix}_ImageIDs.txt").write_text(
                "".join(f"{row[0]}\n" for row in rows["C1"])
            )
            image_folder = folder / images_name
        for image in range(images):
            image_id = rows["C1"][image][0]
            # Radiology images come in many sizes.
            size = (40 + 8 * (image % 3), 32 + 4 * (image % 2))
            write_picture(image_folder / f"{image_id}.jpg", colours[image % 3], size, "JPEG")
    return written


# ---- GQA ------------------------------------------------------------------------------------
def gqa_questions(split: str, images: int) -> dict[str, dict[str, object]]:
    """Two questions per image, as in GQA's question files (test splits carry no answers)."""
    colours = list(COLOURS)
    questions: dict[str, dict[str, object]] = {}
    for image in range(images):
        image_id = f"{split[0]}{2300000 + image}"
        colour = colours[image % 3]
        asked = [
            ("What color is the square?", colour, f"The square is {colour}.", "query", "attr"),
            ("Is the square red?", "yes" if colour == "red" else "no", "", "verify", "attr"),
        ]
        for text, answer, full_answer, structural, semantic in asked:
            item: dict[str, object] = {"imageId": image_id, "question": text, "isBalanced": True}
            if split not in ("test", "challenge", "submission"):
                item.update(
                    answer=answer,
                    fullAnswer=full_answer or f"{answer.capitalize()}, it is.",
                    types={"structural": structural, "semantic": semantic, "detailed": "color"},
                    groups={"global": "color", "local": "10c-square_color"},
                    entailed=[],
                    equivalent=[],
                    annotations={"answer": {}, "question": {}, "fullAnswer": {}},
                    semantic=[{"operation": "select", "dependencies": [], "argument": "square"}],
                    semanticStr="select: square",
                )
            questions[f"{split}{len(questions):05d}"] = item
    return questions


def write_gqa(root: Path, splits: dict[str, int]) -> dict[str, dict[str, dict[str, object]]]:
    """GQA's layout under `root`: questions1.2/<split>_balanced_questions.json and images/."""
    written = {}
    colours = list(COLOURS)
    (root / "questions1.2").mkdir(parents=True, exist_ok=True)
    for split, images in splits.items():
        questions = gqa_questions(split, images)
        path = root / "questions1.2" / f"{split}_balanced_questions.json"
        path.write_text(json.dumps(questions), encoding="utf-8")
        for image in range(images):
            image_id = f"{split[0]}{2300000 + image}"
            size = (50 + 10 * (image % 2), 40)
            write_picture(root / "images" / f"{image_id}.jpg", colours[image % 3], size, "JPEG")
        written[split] = questions
    return written


# ---- GloVe ----------------------------------------------------------------------------------
def write_glove(path: Path, words: list[str], dimension: int) -> Path:
    """A GloVe text file (`word v1 v2 ...` per line) with seeded vectors for `words`."""
    generator = np.random.default_rng(0)
    lines = []
    for word in words:
        vector = generator.standard_normal(dimension).round(5)
        lines.append(word + " " + " ".join(f"{value:.5f}" for value in vector))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
