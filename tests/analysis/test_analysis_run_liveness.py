"""A run whose summary.json says "running": `loom runs`, `loom report` and `loom compare` ask
its lock whether a process still trains there, and show it as dead once that process is gone.

The lock is a real `RunLock` held by another process, killed with SIGKILL: the kernel frees
an flock however its holder dies, which is what tells a dead run from a live one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from argparse import Namespace
from pathlib import Path

import pytest

from torchloom.analysis.compare import write_comparison
from torchloom.analysis.html_report import write_report
from torchloom.cli import runs as runs_command

# Holds the run's lock until killed; first says which heavy modules `loom runs` imported.
HOLDER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    import torchloom.analysis.runs_table
    from torchloom.engine.run_lock import RunLock
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "matplotlib"))
    lock = RunLock(Path(sys.argv[1])).acquire()
    print(json.dumps(heavy), flush=True)
    time.sleep(600)
    """
)


def summary(folder: Path, **fields: object) -> Path:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"pipeline": folder.parent.name, **fields}))
    return folder


def status_cell(expdir: Path, pipeline: str, capsys: pytest.CaptureFixture[str]) -> str:
    """The status column of `loom runs` for the run of `pipeline` (a run per pipeline)."""
    arguments = Namespace(expdir=str(expdir), sort=None, limit=None, descending=None)
    assert runs_command.run(arguments) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines[0].index("status")
    end = lines[0].index("epochs")
    row = next(line for line in lines[2:] if line.split()[0] == pipeline)
    return row[start:end].strip()


def test_a_run_is_running_while_its_process_holds_the_lock_and_dead_once_it_is_killed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expdir = tmp_path / "runs"
    run = summary(expdir / "live" / "20240101_090000", status="running")
    other = summary(expdir / "done" / "20240101_080000", status="epoch_limit", epochs=1)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert json.loads(holder.stdout.readline()) == [], "loom runs imports no torch"
        assert status_cell(expdir, "live", capsys) == f"running (held by process {holder.pid})"
        report = write_report(run).read_text(encoding="utf-8")
        assert f"running (held by process {holder.pid})" in report
    finally:
        holder.kill()  # SIGKILL: no handler runs, no file is tidied up
        holder.wait(timeout=30)
    assert (run / ".lock").exists(), "the killed holder left its lock file behind"
    gone = f"process {holder.pid} is gone"
    assert (
        status_cell(expdir, "live", capsys)
        == f"dead ({gone}; no checkpoints/last.pt to resume from)"
    )
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.pt").write_bytes(b"not read here")
    assert status_cell(expdir, "live", capsys) == (
        f"dead ({gone}; resume with loom train --resume FOLDER)"
    )
    assert status_cell(expdir, "done", capsys) == "epoch_limit", "a finished run is not asked"
    report = write_report(run).read_text(encoding="utf-8")
    assert f"dead ({gone}; resume with loom train --resume {run}" in report
    page = write_comparison([run, other], tmp_path / "compare.html").read_text(encoding="utf-8")
    assert f"dead ({gone}; resume with loom train --resume {run}" in page


def test_a_running_summary_without_a_lock_holder_is_dead(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A summary left at "running" by a process that never took the lock (a torchloom from
    before the lock, or one killed between writing the summary and locking)."""
    expdir = tmp_path / "runs"
    summary(expdir / "old" / "20240101_090000", status="running")
    cell = status_cell(expdir, "old", capsys)
    assert cell.startswith("dead (no lock file"), cell


def test_the_lock_records_pid_host_and_start_and_its_heartbeat_is_refreshed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a reader on another host has to go by: the record, and the lock file's mtime,
    which the holder's heartbeat thread keeps fresh while the run lives."""
    import os
    import socket
    import time

    from torchloom.engine import run_lock

    monkeypatch.setattr(run_lock, "HEARTBEAT_SECONDS", 0.05)
    lock = run_lock.RunLock(tmp_path).acquire()
    try:
        record = run_lock.read_lock_record(tmp_path / ".lock")
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        assert abs(record["started"] - time.time()) < 60
        os.utime(tmp_path / ".lock", (0, 0))  # as if the last beat were long ago
        deadline = time.time() + 10
        while (tmp_path / ".lock").stat().st_mtime == 0 and time.time() < deadline:
            time.sleep(0.02)
        assert (tmp_path / ".lock").stat().st_mtime > time.time() - 10, "no heartbeat"
        assert run_lock.run_liveness(tmp_path).alive
    finally:
        lock.release()
    assert not run_lock.run_liveness(tmp_path).alive


def test_a_run_of_another_host_is_dead_once_its_heartbeat_is_stale(tmp_path: Path) -> None:
    from torchloom.engine import run_lock

    lock_file = tmp_path / ".lock"
    lock_file.write_text(json.dumps({"pid": 4242, "host": "elsewhere", "started": 0}))
    beat = lock_file.stat().st_mtime
    fresh = run_lock.run_liveness(tmp_path, now=beat + 5)
    assert fresh.alive and fresh.host == "elsewhere" and fresh.pid == 4242
    stale = run_lock.run_liveness(tmp_path, now=beat + run_lock.STALE_AFTER_SECONDS + 1)
    assert not stale.alive and "heartbeat from elsewhere" in stale.reason
