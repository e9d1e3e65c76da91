"""The files a received export's sidecar.json has `loom predict` read for the components before
its graph: their artifacts (a vocabulary), their trained weights, their path parameters.

A received export is untrusted input: `loom predict` reads only the files the export wrote,
each component's in `artifacts/<component>/` of the export folder (export.py,
upstream_weights.py), and follows a path parameter only where the rebuild gives the component
the export's own copy instead (a vocabulary: `ARTIFACT_PARAMETERS`). A sidecar naming any other
file (`../outside/vocabulary.txt`, `/etc/passwd`, a link out of the folder) is a DeployError
naming sidecar.json and the key, raised before any component is built or any file read.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

from torchloom.core.file_names import file_name_problem, path_parameters
from torchloom.core.registry import resolve
from torchloom.errors import DeployError, shown_briefly

ARTIFACTS_FOLDER = "artifacts"
# Path parameter -> the artifact whose copy in the export the rebuild gives it (text_inputs.py):
# the path in the sidecar is the run's, never read.
ARTIFACT_PARAMETERS = {"vocabulary_file": "vocabulary.txt"}
# An installed package's name, which a READS_A_PATH_OR_PACKAGE parameter may hold instead of a
# path (PretrainedSentenceEncoder's default model): it names no file of the sender's choosing.
PACKAGE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")

SHOWN_PATH = 200  # characters of a path a message shows: most paths whole, a damaged value cut
_ONLY_ITS_OWN = (
    "`loom predict` reads only the files an export wrote, each component's in "
    f"{ARTIFACTS_FOLDER}/<component>/ of its folder: export the run again (loom export)"
)


def own_artifact(artifacts: list[str], name: str) -> str | None:
    """The path (relative to the export folder) of the artifact file `name` among a step's
    `artifacts`, or None."""
    return next((path for path in artifacts if PurePosixPath(path).name == name), None)


def check_files_before_graph(folder: Path, steps: Any) -> None:
    """A DeployError unless every file the sidecar's components before the graph (`steps`, its
    `before_graph`) would have read is one the export wrote, inside `folder`."""
    if not isinstance(steps, list):
        raise _refused(folder, "before_graph", steps, "it is not a list of components")
    for index, step in enumerate(steps):
        key = f"before_graph[{index}]"
        if not isinstance(step, dict):
            raise _refused(folder, key, step, "it is not a mapping of a component's record")
        name = step.get("name")
        if not isinstance(name, str) or file_name_problem(name):
            raise _refused(folder, f"{key}.name", name, "it is not a component's name")
        artifacts = step.get("artifacts", [])
        if not isinstance(artifacts, list):
            raise _refused(folder, f"{key}.artifacts", artifacts, "it is not a list of files")
        for position, relative in enumerate(artifacts):
            _own_file(folder, name, relative, f"{key}.artifacts[{position}]")
        if step.get("weights") is not None:
            _own_file(folder, name, step["weights"], f"{key}.weights")
        _check_path_parameters(folder, step, key, artifacts)


def _own_file(folder: Path, component: str, relative: Any, key: str) -> Path:
    """`folder / relative` when it is a file the export wrote for `component`; a DeployError
    naming `key` otherwise."""
    if not isinstance(relative, str):
        raise _refused(folder, key, relative, "it is not the path of a file in the export")
    parts = PurePosixPath(relative).parts
    if PurePosixPath(relative).is_absolute() or ".." in parts or "\\" in relative:
        raise _refused(folder, key, relative, "it names a file outside the export folder")
    if len(parts) != 3 or parts[:2] != (ARTIFACTS_FOLDER, component) or file_name_problem(parts[2]):
        raise _refused(
            folder,
            key,
            relative,
            f"it is not a file the export wrote for component '{component}' "
            f"({ARTIFACTS_FOLDER}/{component}/<file>)",
        )
    path = folder / relative
    if not path.resolve().is_relative_to(folder.resolve()):
        raise _refused(folder, key, relative, "it leads outside the export folder (a link)")
    if not path.is_file():
        raise _refused(folder, key, relative, "the export folder holds no such file")
    return path


def _check_path_parameters(
    folder: Path, step: dict[str, Any], key: str, artifacts: list[str]
) -> None:
    """Each parameter that names a file or folder to read must be one the rebuild replaces
    with the export's own copy, or else unset (or an installed package's name, where the
    component takes one)."""
    params = step.get("params")
    if not isinstance(params, dict):
        raise _refused(folder, f"{key}.params", params, "it is not a mapping of parameters")
    component = resolve(step.get("type"), f"'{folder / 'sidecar.json'}' {key}.type")
    for parameter, package_allowed in path_parameters(component.Params).items():
        value = params.get(parameter)
        own = ARTIFACT_PARAMETERS.get(parameter)
        if (
            not _names_a_path(value)
            or (own is not None and own_artifact(artifacts, own) is not None)
            or (package_allowed and isinstance(value, str) and PACKAGE_NAME.fullmatch(value))
        ):
            continue
        raise DeployError.at(
            "",
            f"'{folder / 'sidecar.json'}'",
            f"{key}.params.{parameter} is {shown_briefly(value, SHOWN_PATH)}: it names a file "
            "or folder outside the export, and `loom predict` reads only the export's own files",
            "export the run again (loom export); a component that reads files of its own "
            "(pretrained vectors) must be in the graph (loom export --inputs at its inputs), "
            "or feed the graph's inputs from your own code (see sidecar.json)",
        )


def _names_a_path(value: Any) -> bool:
    """Whether a parameter's value names a file or folder: a string, or a list holding one
    (unset is None; a number is no path, as a DARTS cell's `drop_path`, named like one)."""
    return isinstance(value, str) or (
        isinstance(value, list) and any(isinstance(item, str) for item in value)
    )


def _refused(folder: Path, key: str, value: Any, why: str) -> DeployError:
    return DeployError.at(
        "",
        f"'{folder / 'sidecar.json'}'",
        f"{key} is {shown_briefly(value, SHOWN_PATH)}: {why}",
        _ONLY_ITS_OWN,
    )
