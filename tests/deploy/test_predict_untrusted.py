"""`loom predict` on a received export: its sidecar.json is untrusted input. A damaged or
hostile image recipe is a plain error naming sidecar.json and the key (exit 2), never a
traceback nor an allocation of gigabytes (the files a text export names:
test_predict_text_files.py). Inputs that are not regular files (a device, a FIFO) are named
as such."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from export_copies import digit_png, edit_sidecar, export_copy
from torchloom.cli.main import main


def _resizes(value: Any) -> Callable[[dict], None]:
    return lambda record: record["preprocessing"].update(resizes=value)


def _size_alone(height: Any, width: Any) -> Callable[[dict], None]:
    """An export from before `resizes` was recorded: height and width are the only size."""

    def edit(record: dict) -> None:
        del record["preprocessing"]["resizes"]
        record["preprocessing"].update(height=height, width=width)

    return edit


def _normalize(value: Any) -> Callable[[dict], None]:
    return lambda record: record["preprocessing"].update(normalize=value)


HUGE = 60_000  # 3.6 GB of grey pixels, 14 GB more as float32
# The largest resize this test lets Pillow make (100 MB of grey pixels): above it, an unchecked
# recipe would have the test itself allocate gigabytes.
TEST_RESIZE_LIMIT = 10_000


@pytest.mark.parametrize(
    ("damage", "key", "reason"),
    [
        (_resizes([[HUGE, HUGE]]), "preprocessing.resizes", "at most"),
        (_resizes([[28, 28], [HUGE, 28]]), "preprocessing.resizes", "at most"),
        (_resizes("ab"), "preprocessing.resizes", "not a list of [height, width]"),
        (_resizes([[1]]), "preprocessing.resizes", "not a list of [height, width]"),
        (_resizes([[-3, 5]]), "preprocessing.resizes", "positive whole number"),
        (_resizes([[28.5, 28]]), "preprocessing.resizes", "positive whole number"),
        (_resizes([[True, 28]]), "preprocessing.resizes", "positive whole number"),
        (_resizes([]), "preprocessing.resizes", "not a list of [height, width]"),
        (_resizes([[20, 20]]), "preprocessing.resizes", "ends at [20, 20], not at"),
        (_size_alone(HUGE, HUGE), "preprocessing.height", "at most"),
        (_size_alone(28, "28"), "preprocessing.width", "positive whole number"),
        (_normalize({"mean": "x", "std": [1]}), "preprocessing.normalize.mean", "list of 1"),
        (_normalize([1]), "preprocessing.normalize", "not a mapping of mean and std"),
        (_normalize({"mean": [0.1]}), "preprocessing.normalize.std", "list of 1"),
        (_normalize({"mean": [0.1, 0.2], "std": [1]}), "normalize.mean", "list of 1"),
        (_normalize({"mean": [0.1], "std": [0]}), "preprocessing.normalize.std", "0"),
        (_normalize({"mean": [float("nan")], "std": [1]}), "normalize.mean", "finite"),
        (_normalize({"mean": [0.1], "std": ["1"]}), "preprocessing.normalize.std", "finite"),
        (lambda r: r["preprocessing"].update(scale=float("inf")), "scale", "finite number"),
    ],
    ids=[
        "huge-resize",
        "huge-second-resize",
        "resizes-a-string",
        "resize-of-one-side",
        "negative-side",
        "fractional-side",
        "boolean-side",
        "resizes-empty",
        "resizes-end-elsewhere",
        "huge-height-alone",
        "width-a-string",
        "mean-a-string",
        "normalize-a-list",
        "no-std",
        "mean-per-other-depth",
        "std-zero",
        "mean-nan",
        "std-a-string",
        "scale-inf",
    ],
)
def test_a_damaged_image_recipe_names_the_sidecar_and_the_key(
    onnx_folder: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    damage: Callable[[dict], None],
    key: str,
    reason: str,
) -> None:
    """Each was used as it stood: a 60000x60000 resize allocated gigabytes (MemoryError under
    a memory limit), the others ended in numpy's or PIL's tracebacks (exit 1)."""
    resize = Image.Image.resize

    def bounded_resize(image: Image.Image, size: tuple[int, int], *args: Any, **kw: Any) -> Any:
        assert max(size) <= TEST_RESIZE_LIMIT, f"resized to {size}"
        return resize(image, size, *args, **kw)

    monkeypatch.setattr(Image.Image, "resize", bounded_resize)
    folder = export_copy(onnx_folder, tmp_path)
    edit_sidecar(folder, damage)
    capsys.readouterr()
    assert main(["predict", str(folder), str(digit_png(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert f"'{folder / 'sidecar.json'}': is damaged" in err, err
    assert key in err and reason in err and "Traceback" not in err, err


def test_an_input_that_is_not_a_regular_file_is_named_so(
    onnx_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """/dev/null and a FIFO were said not to exist."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for given in ("/dev/null", str(fifo)):
        capsys.readouterr()
        assert main(["predict", str(onnx_folder), given]) == 2
        err = capsys.readouterr().err
        assert f"input '{given}': is not a regular file" in err, err
        assert "does not exist" not in err


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        # Python's JSON parser recursed past its limit: RecursionError, a traceback (exit 1)
        ("[" * 100_000 + "]" * 100_000, "is nested too deeply to be a record torchloom wrote"),
        # read whole, whatever its size
        ('{"labels": "' + " " * 16_000_000 + '"}', "has 16,000,014 bytes, more than"),
    ],
    ids=["nested", "too-large"],
)
def test_a_sidecar_that_is_no_record_of_torchloom_is_named_not_a_traceback(
    onnx_folder: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: str,
    reason: str,
) -> None:
    folder = export_copy(onnx_folder, tmp_path)
    (folder / "sidecar.json").write_text(content, encoding="utf-8")
    capsys.readouterr()
    assert main(["predict", str(folder), str(digit_png(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert f"'{folder / 'sidecar.json'}': {reason}" in err and "Traceback" not in err, err
