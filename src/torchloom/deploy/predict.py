"""`loom predict EXPORT_DIR INPUT...`: labels for raw inputs from an ONNX export, in ONNX
Runtime. For images only numpy, Pillow and onnxruntime are used (no torch, no torchloom model
code): what a deployment does with `model.onnx` and `sidecar.json`, which this doubles as an
example of (the image recipe: image_recipe.py). For an export that starts after python-side
components (a text pipeline's tokenizer and indexer, `loom export --inputs`), those components
are rebuilt from the sidecar by torchloom (text_inputs.py); the model still runs in ONNX
Runtime. A received export is untrusted input: its sidecar is checked before it is used.
"""

from __future__ import annotations

import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from torchloom.data.json_files import UnreadableJson, read_json
from torchloom.deploy.image_recipe import image_recipe_problem, image_tensor
from torchloom.errors import DeployError, LoomError


@dataclass
class Prediction:
    source: str
    top: list[tuple[str, float]]  # (label, probability), most probable first


def export_folder(given: Path) -> Path:
    """The ONNX export folder: `given` itself, or a run folder's exports/onnx."""
    inside = given / "exports" / "onnx"
    return inside if not (given / "model.onnx").exists() and inside.is_dir() else given


def read_sidecar(export_dir: Path) -> dict[str, Any]:
    model, path = export_dir / "model.onnx", export_dir / "sidecar.json"
    if not model.is_file() or not path.is_file():
        raise DeployError.at(
            "",
            f"'{export_dir}'",
            "is not an ONNX export of `loom export` (it needs model.onnx and sidecar.json)",
            "run `loom export RUN_DIR --format onnx` first, then give RUN_DIR or "
            "RUN_DIR/exports/onnx",
        )
    try:
        record = read_json(path)
    except UnreadableJson as error:
        raise DeployError.at(
            "", f"'{path}'", str(error), "export the run again (loom export)"
        ) from error
    if not isinstance(record, dict) or "preprocessing" not in record:
        raise DeployError.at("", f"'{path}'", "is not a sidecar of `loom export`")
    recipe, inputs = record["preprocessing"], record.get("inputs")
    damaged = (
        "preprocessing is not a mapping"
        if not isinstance(recipe, dict)
        else "inputs does not name the graph's input"
        if not (isinstance(inputs, list) and inputs and isinstance(inputs[0], dict))
        or not isinstance(inputs[0].get("name"), str)
        else image_recipe_problem(recipe)
        if recipe.get("kind") == "image"
        else ""
    )
    if damaged:
        raise DeployError.at(
            "", f"'{path}'", f"is damaged: {damaged}", "export the run again (loom export)"
        )
    return record


def _loaded_session(folder: Path) -> Any:
    """ONNX Runtime's session of the export's model.onnx; a file it cannot load (truncated,
    not ONNX) is a DeployError naming it."""
    import onnxruntime

    try:
        return onnxruntime.InferenceSession(
            str(folder / "model.onnx"), providers=["CPUExecutionProvider"]
        )
    except Exception as error:  # onnxruntime's own exception types, by message
        raise DeployError.at(
            "",
            f"'{folder / 'model.onnx'}'",
            f"cannot be loaded by ONNX Runtime: {str(error).splitlines()[0]}",
            "export the run again (loom export)",
        ) from error


def _scores(folder: Path, session: Any, name: str, feed: dict[str, Any]) -> Any:
    """The export's output `name` for `feed`; ONNX Runtime refusing the inputs the sidecar's
    recipe made (another model's sidecar, a damaged one) is a DeployError."""
    try:
        return session.run([name], feed)
    except Exception as error:
        raise DeployError.at(
            "",
            f"export '{folder}'",
            f"its model refused the inputs its sidecar.json describes: "
            f"{str(error).splitlines()[0]}",
            "model.onnx and sidecar.json must come from one `loom export`: export again",
        ) from error


# What `loom predict` turns into label probabilities: a classifier's [batch, classes] output
# as the sidecar records it (sidecar.py: from the output stream's description).
CLASS_SCORES = ("logits", "log-probabilities")


def _probabilities(values: np.ndarray, kind: str) -> np.ndarray:
    """Per row: softmax of logits; exp of log-probabilities (they are probabilities already,
    and a softmax of them, equal in exact arithmetic, would only renormalise rounding)."""
    if kind == "log-probabilities":
        return np.asarray(np.exp(values))
    shifted = values - values.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return np.asarray(exp / exp.sum(axis=-1, keepdims=True))


def class_output(folder: Path, record: dict[str, Any]) -> dict[str, Any]:
    """The export's first output, when it holds class scores `loom predict` can read; a
    DeployError naming the export folder and the output otherwise."""
    outputs = record.get("outputs")
    if not isinstance(outputs, list) or not outputs or not isinstance(outputs[0], dict):
        raise DeployError.at("", f"'{folder / 'sidecar.json'}'", "records no outputs")
    output = outputs[0]
    if output.get("kind") not in CLASS_SCORES:
        raise DeployError.at(
            "",
            f"export '{folder}'",
            f"output '{output.get('name')}' holds {output.get('kind')} "
            f"({output.get('description') or 'no description'}), not class logits or "
            "log-probabilities: `loom predict` has no label probabilities to give",
            "export a classifier's output (--outputs), or read this output from your own "
            "code (see sidecar.json)",
        )
    return output


def predict(export_dir: str | Path, inputs: list[str], top: int = 1) -> list[Prediction]:
    folder = export_folder(Path(export_dir).expanduser())
    record = read_sidecar(folder)
    recipe = record["preprocessing"]
    if top < 1:
        raise DeployError.at("command line", "--top", "must be at least 1")
    class_output(folder, record)  # before any input is read
    if recipe.get("kind") != "image":
        return _predict_texts(folder, record, inputs, top)
    tensors = []
    for name in inputs:
        path = Path(name).expanduser()
        if path.is_dir():
            raise DeployError.at(
                "", f"input '{path}'", "is a folder, not an image", f"name its images: {path}/*"
            )
        _refuse_special_file(path, "an image file")
        if not path.is_file():
            raise DeployError.at("", f"input '{path}'", "does not exist")
        tensors.append(image_tensor(path, recipe))
    session = _loaded_session(folder)
    input_name = record["inputs"][0]["name"]
    return [
        _top(folder, record, session, name, {input_name: tensor}, top)
        for name, tensor in zip(inputs, tensors, strict=True)
    ]


def _top(
    folder: Path,
    record: dict[str, Any],
    session: Any,
    source: str,
    feed: dict[str, Any],
    top: int,
) -> Prediction:
    output = class_output(folder, record)
    # An output's own labels (sidecar.py); "labels" of an export made before they were kept.
    labels = output["labels"] if "labels" in output else record.get("labels")
    (values,) = _scores(folder, session, output["name"], feed)
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or values.shape[0] != 1:
        raise DeployError.at(
            "",
            f"export '{folder}'",
            f"output '{output['name']}' has shape {values.shape} for one input, not "
            "[batch, classes]: `loom predict` reads only a classifier's 2-D scores",
            "export a classifier's output (--outputs), or read this output from your own "
            "code (see sidecar.json)",
        )
    probabilities = _probabilities(values, output["kind"])[0]
    order = np.argsort(-probabilities)[:top]
    return Prediction(
        source,
        [
            (labels[i] if labels and i < len(labels) else str(i), float(probabilities[i]))
            for i in order
        ],
    )


def _predict_texts(
    folder: Path, record: dict[str, Any], inputs: list[str], top: int
) -> list[Prediction]:
    """Each INPUT a text file (its whole text one input), or else a text itself."""

    from torchloom.deploy.text_inputs import text_feed

    if not record.get("before_graph"):
        raise DeployError.at(
            "",
            f"'{folder / 'sidecar.json'}'",
            f"the export's task ({record.get('task')}) has no raw-input recipe "
            "`loom predict` can apply: the graph reads "
            + ", ".join(
                f"'{entry.get('name')}' ({entry.get('description') or 'tensors'})"
                for entry in record.get("inputs") or []
            )
            + ", tensors only the task makes",
            "feed the graph's input tensors from your own code (see sidecar.json)",
        )
    session = _loaded_session(folder)
    results = []
    for given in inputs:
        path = Path(given).expanduser()
        _refuse_special_file(path, "a text file, or a text")
        if not _is_file(path) and _looks_like_a_file_name(given):
            raise DeployError.at(
                "",
                f"input '{given}'",
                "is no file (an input is a text file's name, or else a text)",
                "check the path; a text of one word with a dot or a slash can be given with a "
                "space after it",
            )
        try:
            text = path.read_text(encoding="utf-8") if _is_file(path) else given
        except (OSError, UnicodeDecodeError) as error:
            raise DeployError.at(
                "", f"input '{path}'", f"cannot be read as UTF-8 text: {error}"
            ) from error
        try:
            feed = text_feed(folder, record, [text])
        except LoomError:
            raise
        except Exception as error:  # a damaged recipe: a parameter, a vocabulary size
            raise DeployError.at(
                "",
                f"'{folder / 'sidecar.json'}'",
                f"its text recipe cannot be applied: {type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else ''}",
                "export the run again (loom export)",
            ) from error
        results.append(_top(folder, record, session, given, feed, top))
    return results


def _looks_like_a_file_name(given: str) -> bool:
    """No space, and a folder or a file suffix (`articel.txt`, `texts/a`): a mistyped file
    name, which would otherwise be classified as a text of one word."""
    if not given or any(character.isspace() for character in given):
        return False
    path = Path(given)
    return len(path.parts) > 1 or bool(re.fullmatch(r"\.[A-Za-z0-9]{1,5}", path.suffix))


def _is_file(path: Path) -> bool:
    """Whether `path` names a file; a text too long for a file name (a whole article given
    on the command line) is none: is_file() raises for it (ENAMETOOLONG)."""
    try:
        return path.is_file()
    except OSError:
        return False


def _refuse_special_file(path: Path, wanted: str) -> None:
    """A DeployError for an input that exists but is neither a file nor a folder (a device
    such as /dev/null, a FIFO, a socket): it was said not to exist, and reading a FIFO waits
    for a writer."""
    try:
        mode = path.stat().st_mode
    except (OSError, ValueError):  # none there, a name too long for one, a NUL in it
        return
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise DeployError.at(
            "",
            f"input '{path}'",
            "is not a regular file (a device, a FIFO or a socket)",
            f"give {wanted}",
        )
