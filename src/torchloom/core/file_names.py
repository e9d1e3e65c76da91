"""File names that a config chooses for what a component writes (an exporter's CSV, report
files named after an output, a viewer's PNGs named after its component).

A config is untrusted input: nothing it names may write outside the folder the worker gives.
So such a name is a plain name inside that folder, never a path: `../../x`, `/abs/x`, `a/b`,
`.`, `..` and the empty name are refused when the config is checked (`loom check`), before
any data is read or any file written. Params use `PlainFileName`, so pydantic's error names
the file, the line, the component and the key. So do names a config reads inside a folder
it gives (an ImageFolder's `classes`: `../../x` read images from anywhere). And parameters
that name a file or folder to read say so (`READS_A_PATH`), for what must not read any.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel
from pydantic_core import PydanticCustomError

MAX_NAME_BYTES = 255  # NAME_MAX of the usual file systems (ext4, xfs, btrfs, APFS)


def file_name_problem(name: str) -> str:
    """Why `name` is not a plain file name inside a folder; '' when it is one."""
    if not name:
        return "it is empty"
    if name in (".", ".."):
        return f"'{name}' names a folder"
    if "/" in name or "\\" in name:
        return "it holds a path separator (it would name a file outside its folder)"
    if any(ord(character) < 32 for character in name):
        return "it holds a control character"
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        return f"it is longer than {MAX_NAME_BYTES} bytes"
    return ""


def _plain(name: str) -> str:
    problem = file_name_problem(name)
    if problem:  # a custom error type: pydantic prints its message without "Value error, "
        raise PydanticCustomError(
            "plain_file_name",
            "must be a plain file name inside its folder: {problem}",
            {"problem": problem},
        )
    return name


PlainFileName = Annotated[str, AfterValidator(_plain)]


# What the workers write at the top of a run or pass folder (config.yaml, the statistics CSVs,
# the summaries, the log, the lock): a component's file there may not take one of these names
# (a StreamFileExporter named config.yaml replaced the run's, and the run could not resume).
WORKER_FILES = frozenset(
    {
        "config.yaml",
        "summary.json",
        "run.log",
        "started_by.json",
        "skipped.json",
        "report.html",
        "genotype.yml",
        "derived.yml",
        "lr_find.csv",
        "lr_find.png",
        "lr_find.json",
        ".lock",
        # and the folders: a file named `checkpoints` made the run fail at its first save
        *("checkpoints", "reports", "tensorboard", "process", "exports", "quantized"),
        *("logs", "searches", "trials"),
        *(
            f"{section}{suffix}"
            for section in ("training", "validation", "test")
            for suffix in ("_statistics.csv", "_epoch_statistics.csv", "_summary.json")
        ),
    }
)


def _not_a_worker_file(name: str) -> str:
    if name in WORKER_FILES:
        raise PydanticCustomError(
            "worker_file_name",
            "'{name}' is a file or folder the run or pass folder already has (config.yaml, "
            "summary.json, run.log, <section>_statistics.csv, checkpoints, reports, ...): it "
            "would replace it or fail on it",
            {"name": name},
        )
    return name


# A plain file name for a file a component writes beside the worker's own files.
OwnFileName = Annotated[str, AfterValidator(_plain), AfterValidator(_not_a_worker_file)]


# A parameter that names a file or folder its component reads (a vocabulary, a vectors file, a
# model folder) says so in its schema, `Field(..., json_schema_extra=READS_A_PATH)`, so that
# `loom predict` can refuse it in a received export's sidecar.json, which may make it read
# only the export's own files (deploy/sidecar_files.py). READS_A_PATH_OR_PACKAGE: or else the
# name of an installed package that holds the files, which names no file of the sender's.
READS_A_PATH: dict[str, Any] = {"reads": "a path"}
READS_A_PATH_OR_PACKAGE: dict[str, Any] = {"reads": "a path or a package"}
# A third-party component's schema may not say so: parameters named like these count as well.
PATH_NAME_SUFFIXES = ("_file", "_files", "_folder", "_dir", "_path")


def path_parameters(params: type[BaseModel]) -> dict[str, bool]:
    """{name: whether an installed package's name may stand for the path} of each parameter
    of a component's schema that names a file or folder its component reads."""
    found = {}
    for name, field in params.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if extra.get("reads") == READS_A_PATH_OR_PACKAGE["reads"]:
            found[name] = True
        elif extra.get("reads") == READS_A_PATH["reads"] or name.endswith(PATH_NAME_SUFFIXES):
            found[name] = False
    return found
