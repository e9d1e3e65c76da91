"""`loom search --storage grpc://HOST:PORT` through a real `loom search-server` (Optuna's gRPC
storage proxy in front of an SQLite database), started here on a port of 127.0.0.1: workers
asking at once are each handed a queued trial of their own, processes racing for the last
trials start exactly the budget (no lock reaches through the proxy: claim_trial hands a trial
over the budget back), two searches share one study, and a server that is not there, or a
journal given to the server, is refused plainly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from search_helpers import IDENTITY, SOURCE, claim_race, tiny_config, two_machines_search

from torchloom.cli.main import main
from torchloom.search.claims import counted_trials
from torchloom.search.study import create_study, load_study

if TYPE_CHECKING:
    import optuna

pytest.importorskip("grpc", reason="grpcio is not installed (pip install 'torchloom[search]')")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def search_server(storage: str, host: str, port: int) -> subprocess.Popen[str]:
    """`loom search-server STORAGE --host HOST --port PORT`, its output in `stdout`."""
    command = [sys.executable, "-m", "torchloom.cli.main", "search-server"]
    command += [storage, "--host", host, "--port", str(port)]
    server = subprocess.Popen(
        command,
        env={**os.environ, "PYTHONPATH": SOURCE},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return server


@pytest.fixture(scope="module")
def grpc_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    database = tmp_path_factory.mktemp("grpc") / "studies.db"
    port = _free_port()
    server = search_server(f"sqlite:///{database}", "127.0.0.1", port)
    assert server.stdout is not None
    first = server.stdout.readline()  # the server says where it listens once it does
    assert first.startswith("search server: ") and f"grpc://127.0.0.1:{port}" in first, first
    try:
        yield f"grpc://127.0.0.1:{port}"
    finally:
        server.send_signal(signal.SIGTERM)  # stops as Ctrl-C does
        rest = server.communicate(timeout=60)[0]
        assert server.returncode == 0 and "search server: stopped" in rest, rest


def test_each_queued_trial_is_handed_to_one_worker(grpc_url: str) -> None:
    """Workers, each with its own channel to the server as separate processes have, ask for
    queued trials (retries, a grid) at the same moments: each queued trial goes to exactly one
    of them. Before the server made its state changes one at a time, SQLite behind it (no
    row lock) let two of its threads both move one WAITING trial to RUNNING: 5 to 16 trials
    of 120 were handed out twice in each of 10 tries (both workers trained them)."""
    create_study(grpc_url, "queue", IDENTITY)
    # As many workers as the server has threads (Optuna's make_server: 10); 120 trials made
    # the old server hand some out twice in every try.
    workers, rounds = 10, 12
    queued = workers * rounds
    study = load_study(grpc_url, "queue", None, None)
    for number in range(queued):
        study.enqueue_trial({"x": number})
    studies = [load_study(grpc_url, "queue", None, None) for _ in range(workers)]
    together = threading.Barrier(workers, timeout=30)
    handed: list[int] = []

    def worker(own: optuna.Study) -> None:
        for _ in range(rounds):
            together.wait()  # every worker asks at once, all after the same first trial
            handed.append(own.ask().number)

    threads = [threading.Thread(target=worker, args=(own,)) for own in studies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    # One ask per queued trial: a trial handed twice leaves another asked as a new trial.
    assert sorted(handed) == list(range(queued))
    trials = load_study(grpc_url, "queue", None, None).trials
    assert [t.state.name for t in trials] == ["RUNNING"] * queued


def test_processes_on_a_grpc_server_start_exactly_the_budget(tmp_path: Path, grpc_url: str) -> None:
    create_study(grpc_url, "race", IDENTITY)
    claim_race(tmp_path, grpc_url, "race", budget=6, mode="locked")
    study = load_study(grpc_url, "race", None, None)
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(complete) == 6 and counted_trials(study) == 6
    assert {t.state.name for t in study.trials} <= {"COMPLETE", "WAITING"}


@pytest.mark.slow
def test_two_searches_share_one_study_through_the_server(
    tmp_path: Path, mnist_folder: Path, grpc_url: str
) -> None:
    final, ran = two_machines_search(tmp_path, mnist_folder, grpc_url)
    complete = [row for row in final if row["state"] == "complete"]
    others = [(row["number"], row["state"], row.get("reason")) for row in final]
    assert len(complete) == 4 and {row["state"] for row in final} <= {"complete", "waiting"}, others
    folders = [row["run_dir"] for row in complete]
    assert len(set(folders)) == 4
    assert sum(ran) == 4  # every trial ran once, on one machine or the other


def test_a_missing_server_and_a_served_journal_are_refused_plainly(
    tmp_path: Path, mnist_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    search = "search:\n  training.optimizer.lr: {loguniform: [1.0e-4, 1.0e-2]}\n"
    config = tiny_config(tmp_path, mnist_folder, search)
    url = f"grpc://127.0.0.1:{_free_port()}"
    runs = tmp_path / "runs"
    assert (
        main(["search", str(config), "--trials", "1", "--storage", url, "--expdir", str(runs)]) == 2
    )
    error = capsys.readouterr().err
    assert "cannot reach the search server on 127.0.0.1:" in error and "loom search-server" in error
    assert "Traceback" not in error and not runs.exists()
    journal = f"journal:{tmp_path / 'study.journal'}"
    assert main(["search-server", journal, "--port", str(_free_port())]) == 2
    assert "Optuna's gRPC proxy serves a database" in capsys.readouterr().err


def _free_ipv6_port() -> int:
    with socket.socket(socket.AF_INET6) as probe:
        probe.bind(("::1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("host", ["[::1]", "::1"])
def test_a_server_on_ipv6_is_reachable_at_the_address_it_prints(tmp_path: Path, host: str) -> None:
    """`--host '[::1]'` printed grpc://[::1]:PORT, which workers could not use (the brackets
    were dropped, and "::1:PORT" is no address); `--host ::1` could not listen."""
    try:
        port = _free_ipv6_port()
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    server = search_server(f"sqlite:///{tmp_path / 'studies.db'}", host, port)
    assert server.stdout is not None
    try:
        first, second = server.stdout.readline(), server.stdout.readline()
        url = f"grpc://[::1]:{port}"
        assert first.startswith("search server: ") and f" on {url}" in first, first + second
        assert f"--storage {url};" in second, second
        create_study(url, "ipv6", IDENTITY)  # a worker given what the server printed
        assert load_study(url, "ipv6", None, None).study_name == "ipv6"
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=60)


def test_a_grpc_port_of_0_and_a_url_that_is_no_database_are_refused_plainly(
    tmp_path: Path, mnist_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """grpc://HOST:0 became Optuna's default port 13000 without a word; `loom search-server
    foo://x` said to check that the server runs."""
    search = "search:\n  training.optimizer.lr: {loguniform: [1.0e-4, 1.0e-2]}\n"
    config = tiny_config(tmp_path, mnist_folder, search)
    runs = tmp_path / "runs"
    command = ["search", str(config), "--trials", "1", "--expdir", str(runs), "--storage"]
    assert main([*command, "grpc://127.0.0.1:0"]) == 2
    error = capsys.readouterr().err
    assert "grpc://127.0.0.1:0: has no valid port: 0" in error, error
    assert "127.0.0.1:13000" not in error
    for url in ("foo://x", "file:///etc/passwd", "not a url"):
        assert main(["search-server", url, "--port", str(_free_port())]) == 2
        error = capsys.readouterr().err
        assert f"DATABASE_URL: {url}: is not a database URL (give sqlite:///FILE, " in error
        assert "postgresql://" in error and "server runs" not in error, error
        assert main([*command, url]) == 2
        error = capsys.readouterr().err
        assert f"--storage: {url}: is not a database URL" in error and "grpc://" in error, error
    assert not runs.exists()
