"""The swap of a results folder (`deploy/output_folder.py`): whole or not at all, durable
(files and folders flushed before the old one goes), and what other commands wrote inside
the old folder (`keep`) outlives `--force`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from torchloom.data import atomic_files
from torchloom.deploy import output_folder
from torchloom.deploy.output_folder import staged_folder


def earlier_result(target: Path) -> None:
    (target / "process" / "20260101_000000").mkdir(parents=True)
    (target / "process" / "20260101_000000" / "test_summary.json").write_text("{}\n")
    (target / "model.pt").write_bytes(b"old")


def test_force_keeps_what_other_commands_wrote_inside(tmp_path: Path) -> None:
    target = tmp_path / "quantized" / "static"
    earlier_result(target)
    with staged_folder(target, True, "loom quantize", keep=("process",)) as folder:
        (folder / "model.pt").write_bytes(b"new")
    assert (target / "model.pt").read_bytes() == b"new"
    summary = target / "process" / "20260101_000000" / "test_summary.json"
    assert summary.read_text() == "{}\n"
    assert [p.name for p in target.parent.iterdir()] == ["static"]  # nothing hidden left


def test_without_keep_the_earlier_folder_is_replaced_whole(tmp_path: Path) -> None:
    target = tmp_path / "exports" / "onnx"
    earlier_result(target)
    with staged_folder(target, True, "loom export") as folder:
        (folder / "model.onnx").write_bytes(b"new")
    assert sorted(p.name for p in target.iterdir()) == ["model.onnx"]


def test_a_failed_block_keeps_the_earlier_folder_and_its_process_results(tmp_path: Path) -> None:
    target = tmp_path / "quantized" / "static"
    earlier_result(target)
    with (
        pytest.raises(RuntimeError),
        staged_folder(target, True, "loom quantize", keep=("process",)) as folder,
    ):
        (folder / "model.pt").write_bytes(b"new")
        raise RuntimeError("failed midway")
    assert (target / "model.pt").read_bytes() == b"old"
    assert (target / "process" / "20260101_000000" / "test_summary.json").is_file()
    assert [p.name for p in target.parent.iterdir()] == ["static"]


def test_the_swap_is_flushed_to_disk_before_the_old_folder_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "quantized" / "static"
    earlier_result(target)
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace
    real_rmtree = output_folder.shutil.rmtree

    def fsync(descriptor: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{descriptor}")))
        real_fsync(descriptor)

    def replace(source: str | Path, destination: str | Path) -> None:
        events.append(("replace", str(destination)))
        real_replace(source, destination)

    def rmtree(path: str | Path, ignore_errors: bool = False) -> None:
        events.append(("rmtree", str(path)))
        real_rmtree(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(atomic_files.os, "fsync", fsync)
    monkeypatch.setattr(output_folder.os, "replace", replace)
    monkeypatch.setattr(output_folder.shutil, "rmtree", rmtree)
    with staged_folder(target, True, "loom quantize", keep=("process",)) as folder:
        (folder / "model.pt").write_bytes(b"new")
        staging = folder
    into_place = events.index(("replace", str(target)))
    removed = next(i for i, (kind, _) in enumerate(events) if kind == "rmtree")
    # The new file and the staging folder's entries, before the rename into place ...
    assert ("fsync", str(staging / "model.pt")) in events[:into_place]
    assert ("fsync", str(staging)) in events[:into_place]
    # ... the parent folder (the rename itself) after it, before the old folder is removed.
    assert ("fsync", str(target.parent)) in events[into_place:removed]
