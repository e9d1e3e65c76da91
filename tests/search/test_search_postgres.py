"""`loom search --storage postgresql://...` against a real PostgreSQL server (Debian's
`postgresql`, installed by `make test`), started here as an unprivileged user on a port of
127.0.0.1 and removed afterwards: two searches on one study, as two machines would run them;
and an unreachable server named plainly."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from search_helpers import IDENTITY, claim_race, tiny_config, two_machines_search

import torchloom
from torchloom.cli.main import main
from torchloom.search.study import create_study, load_study

BINARIES = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
SOURCE = str(Path(torchloom.__file__).parents[1])


def _as_server_user(command: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root: as root (CI), run it as Debian's `postgres` user.
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    if not BINARIES:
        pytest.skip("Debian postgresql is not installed (make test installs it when root)")
    bin_dir = BINARIES[-1].parent
    folder = Path(tempfile.mkdtemp(prefix="torchloom-pg-"))
    data, log = folder / "data", folder / "server.log"
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
    port = _free_port()
    run = {"check": True, "capture_output": True, "text": True, "timeout": 120}
    subprocess.run(
        _as_server_user(
            [str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "loom", "--no-sync"]
        ),
        **run,
    )
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run(
        _as_server_user(
            [str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "start"]
        ),
        **run,
    )
    try:
        subprocess.run(
            [
                str(bin_dir / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-U",
                "loom",
                "studies",
            ],
            **run,
        )
        # As the docs and every PostgreSQL guide write it: no driver named (study.py).
        yield f"postgresql://loom@127.0.0.1:{port}/studies"
    finally:
        subprocess.run(
            _as_server_user([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
            capture_output=True,
            timeout=60,
            check=False,
        )
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_two_searches_share_one_study_in_postgresql(
    tmp_path: Path, mnist_folder: Path, postgres_url: str
) -> None:
    # Each machine's trials.csv lists the whole study; each trial ran in one folder only.
    final, ran = two_machines_search(tmp_path, mnist_folder, postgres_url)
    numbers = [int(row["number"]) for row in final]
    # The advisory lock: 4 trials asked, 4 run between the two machines, never 5.
    assert numbers == list(range(4))
    assert all(row["state"] == "complete" for row in final)
    folders = [row["run_dir"] for row in final]
    assert len(set(folders)) == len(folders)
    assert sum(ran) == len(final) and min(ran) >= 1  # both machines ran trials, none twice


def test_machines_start_exactly_the_budget_of_trials(tmp_path: Path, postgres_url: str) -> None:
    """Three processes, each in its own folder as on three machines, count and ask at the same
    moments (their count slowed, claim_race.py): the PostgreSQL advisory lock makes them start
    exactly the budget between them. With neither the lock nor claim_trial's check, the same
    race started 8 trials for a budget of 6, in each of two tries by hand."""
    create_study(postgres_url, "race", IDENTITY)
    claim_race(tmp_path, postgres_url, "race", budget=6, mode="exact")
    study = load_study(postgres_url, "race", None, None)
    states = [trial.state.name for trial in study.trials]
    assert states == ["COMPLETE"] * 6


def test_an_unreachable_database_is_named_plainly(
    tmp_path: Path, mnist_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    search = "search:\n  training.optimizer.lr: {loguniform: [1.0e-4, 1.0e-2]}\n"
    config = tiny_config(tmp_path, mnist_folder, search)
    url = f"postgresql://loom@127.0.0.1:{_free_port()}/studies"
    runs = tmp_path / "runs"
    assert (
        main(["search", str(config), "--trials", "1", "--storage", url, "--expdir", str(runs)]) == 2
    )
    error = capsys.readouterr().err
    assert "cannot open the database on 127.0.0.1:" in error
    assert "Traceback" not in error and not runs.exists()
