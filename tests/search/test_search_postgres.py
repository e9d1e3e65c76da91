"""`loom search --storage postgresql://...` against a real PostgreSQL server (Debian's
`postgresql`, installed by `make test`), started here as an unprivileged user on a port of
127.0.0.1 and removed afterwards: two searches on one study, as two machines would run them;
an unreachable server named plainly; and a database that asks for a password, which no file
of the search folder keeps and nothing prints."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
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


PASSWORD = "S3cretPW"
SEARCH = "search:\n  training.optimizer.lr: {loguniform: [1.0e-4, 1.0e-2]}\n"


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


@pytest.fixture(scope="module")
def password_url(postgres_url: str) -> str:
    """A database of its own, `secrets`, whose user `secretive` must give PASSWORD from
    127.0.0.1 (scram-sha-256; `loom`, the fixture's superuser, stays trusted)."""
    psycopg2 = pytest.importorskip("psycopg2")
    port = postgres_url.rsplit(":", 1)[1].split("/")[0]
    admin = psycopg2.connect(host="127.0.0.1", port=port, user="loom", dbname="studies")
    admin.autocommit = True  # CREATE DATABASE refuses a transaction
    with admin.cursor() as cursor:
        cursor.execute(f"CREATE ROLE secretive LOGIN PASSWORD '{PASSWORD}'")
        cursor.execute("CREATE DATABASE secrets OWNER secretive")
        cursor.execute("SHOW hba_file")
        hba = Path(cursor.fetchone()[0])
        rule = "host all secretive 127.0.0.1/32 scram-sha-256\n"  # the first rule that matches
        hba.write_text(rule + hba.read_text())
        cursor.execute("SELECT pg_reload_conf()")
    admin.close()
    for _ in range(50):  # the server reloads its rules a moment later
        try:
            psycopg2.connect(host="127.0.0.1", port=port, user="secretive", dbname="secrets")
        except psycopg2.OperationalError:
            break
        time.sleep(0.1)
    return f"postgresql://secretive:{PASSWORD}@127.0.0.1:{port}/secrets"


def _files_holding(folder: Path, text: str) -> list[str]:
    return [
        str(path.relative_to(folder))
        for path in folder.rglob("*")
        if path.is_file() and text.encode() in path.read_bytes()
    ]


def test_a_database_password_is_never_kept_or_shown_and_a_resume_asks_for_it(
    tmp_path: Path,
    mnist_folder: Path,
    password_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The search folder and its page are what users share; its URL was kept and shown with
    the password. A resume takes it from --storage again (the same database only) or from
    libpq's own places (PGPASSWORD, ~/.pgpass)."""
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "absent.pgpass"))  # not this user's
    config = tiny_config(tmp_path, mnist_folder, SEARCH)
    runs = tmp_path / "runs"
    command = ["search", str(config), "--storage", password_url, "--expdir", str(runs)]
    # Two workers: the other process is handed the password too (its search.json has none).
    assert main([*command, "--study", "kept", "--trials", "2", "--workers", "2"]) == 0
    printed = capsys.readouterr()
    assert PASSWORD not in printed.out + printed.err
    (search_dir,) = (runs / "searches").glob("*/*")
    record = json.loads((search_dir / "search.json").read_text())
    assert record["storage"] == password_url.replace(f":{PASSWORD}@", "@")
    assert "secretive@127.0.0.1" in (search_dir / "search.html").read_text()
    assert _files_holding(search_dir, PASSWORD) == []
    before = (search_dir / "search.json").read_text()

    resume = ["search", "--resume", str(search_dir)]
    assert main([*resume, "--trials", "3"]) == 2
    error = capsys.readouterr().err
    assert "no password supplied" in error and "Traceback" not in error
    assert "--storage" in error and "PGPASSWORD" in error and "~/.pgpass" in error
    other = password_url.replace("/secrets", "/studies")
    assert main([*resume, "--trials", "3", "--storage", other]) == 2
    error = capsys.readouterr().err
    assert "command line: --storage: " in error and "another storage" in error
    assert PASSWORD not in error
    assert (search_dir / "search.json").read_text() == before

    assert main([*resume, "--trials", "3", "--storage", password_url]) == 0
    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    assert main([*resume, "--trials", "4"]) == 0
    monkeypatch.delenv("PGPASSWORD")
    pgpass = tmp_path / "pgpass"
    pgpass.write_text(f"127.0.0.1:*:secrets:secretive:{PASSWORD}\n")
    pgpass.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(pgpass))
    assert main(["report", str(search_dir)]) == 0
    printed = capsys.readouterr()
    assert PASSWORD not in printed.out + printed.err
    assert _files_holding(search_dir, PASSWORD) == []
    with open(search_dir / "trials.csv") as handle:
        assert sum(1 for _ in handle) == 1 + 4
    # A folder of an older torchloom, whose search.json kept the password: it resumes, says
    # that the password is no longer kept, and keeps it no longer.
    monkeypatch.delenv("PGPASSFILE")
    record = json.loads((search_dir / "search.json").read_text())
    (search_dir / "search.json").write_text(json.dumps({**record, "storage": password_url}))
    assert main([*resume, "--trials", "5"]) == 0
    error = capsys.readouterr().err
    assert "no longer keeps the storage's password" in error and PASSWORD not in error
    assert _files_holding(search_dir, PASSWORD) == []


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
