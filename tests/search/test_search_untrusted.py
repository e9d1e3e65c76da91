"""What `loom search`, `loom report` and `loom search-server` make of untrusted input: a
password in a storage URL is never printed, whatever the path."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest
from search_helpers import tiny_config

from torchloom.cli.main import main

SEARCH = "search:\n  training.optimizer.lr: {loguniform: [1.0e-4, 1.0e-2]}\n"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://loom@127.0.0.1:{port}/studies?password=S3cretQ",
        "postgresql://loom@127.0.0.1:{port}/studies?sslmode=disable&PASSWORD=S3cretQ",
        "postgresql://loom:S3cretQ@127.0.0.1:{port}/studies",
        "sqlite://:S3cretQ@/{missing}/studies.db",
    ],
)
def test_a_password_in_a_storage_url_is_not_printed_on_an_error(
    tmp_path: Path, mnist_folder: Path, capsys: pytest.CaptureFixture[str], url: str
) -> None:
    """A `password=` query parameter (which libpq takes) was printed in clear, and the SQLite
    branch printed its URL unmasked (a key of `sqlite+pysqlcipher://:KEY@/file`)."""
    url = url.format(port=_free_port(), missing=tmp_path / "missing")
    config = tiny_config(tmp_path, mnist_folder, SEARCH)
    runs = tmp_path / "runs"
    assert main(["search", str(config), "--trials", "1", "--storage", url, "--expdir", str(runs)])
    error = capsys.readouterr().err
    assert error.startswith("search storage error: --storage: ") and "***" in error, error
    assert "S3cretQ" not in error and not runs.exists()
    assert main(["search-server", url, "--port", str(_free_port())]) == 2
    error = capsys.readouterr().err
    assert "DATABASE_URL: " in error and "S3cretQ" not in error, error


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory, mnist_folder: Path) -> Path:
    """One finished search of one trial, copied by the tests that damage it."""
    folder = tmp_path_factory.mktemp("searched")
    config = tiny_config(folder, mnist_folder, SEARCH)
    runs = folder / "runs"
    assert main(["search", str(config), "--trials", "1", "--expdir", str(runs)]) == 0
    (search_dir,) = (runs / "searches").glob("*/*")
    return search_dir


@pytest.mark.parametrize(
    "appended",
    ["garbage\ngarbage2\n", '{"op_code": 99}\n', '{"op_code": 0}\n', "[1, 2]\n"],
    ids=["not-json", "unknown-op", "op-without-fields", "not-an-object"],
)
def test_a_damaged_journal_is_named_not_a_traceback(
    searched: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], appended: str
) -> None:
    """Optuna replays the whole journal when it opens it: lines it cannot replay raised
    JSONDecodeError, AssertionError, KeyError or TypeError out of `loom report` and
    `loom search --resume` (a single torn last line it forgives)."""
    search_dir = tmp_path / "copy"
    shutil.copytree(searched, search_dir)
    journal = search_dir / "study.journal"
    with journal.open("a") as handle:
        handle.write(appended)
    before = {path: path.read_bytes() for path in search_dir.rglob("*") if path.is_file()}
    capsys.readouterr()
    for command in (["report", str(search_dir)], ["search", "--resume", str(search_dir)]):
        assert main([*command, "--trials", "2"] if "--resume" in command else command) == 2
        error = capsys.readouterr().err
        assert f"{journal.resolve()}: " in error, error
        assert "cannot be replayed by Optuna" in error and "from a copy" in error
        assert "Traceback" not in error
    after = {path: path.read_bytes() for path in search_dir.rglob("*") if path.is_file()}
    assert after == before  # nothing written over what the search had


def test_a_file_that_is_no_journal_is_refused_before_a_search_folder_is_made(
    tmp_path: Path, mnist_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tiny_config(tmp_path, mnist_folder, SEARCH)
    runs = tmp_path / "runs"
    command = ["search", str(config), "--trials", "1", "--expdir", str(runs), "--storage"]
    assert main([*command, f"journal:{config}"]) == 2
    error = capsys.readouterr().err
    assert f"{config}: " in error and "cannot be replayed by Optuna" in error, error
    assert "Traceback" not in error and not runs.exists()
    assert config.read_text().startswith("default_configs:")  # left as it was


def test_a_sampler_optuna_refuses_is_refused_before_a_search_folder_is_made(
    tmp_path: Path, mnist_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The search folder was made, then a ValueError traceback came from the first worker."""
    search = "search:\n  sampler: {type: qmc, qmc_type: bogus}\n" + SEARCH.split("\n", 1)[1]
    config = tiny_config(tmp_path, mnist_folder, search)
    runs = tmp_path / "runs"
    assert main(["search", str(config), "--trials", "2", "--expdir", str(runs)]) == 2
    error = capsys.readouterr().err
    assert "tiny.yml:14: search setting 'sampler': The `qmc_type='bogus'` is invalid" in error
    assert "Traceback" not in error and not runs.exists()


def test_a_search_whose_trials_all_failed_exits_with_status_2(
    tmp_path: Path, mnist_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every trial failed (here: training diverged), "no trial completed", and the command
    said all was well (status 0). The results are written all the same."""
    search = "search:\n  training.optimizer.lr: {choice: [1.0e+30, 1.0e+31]}\n"
    config = tiny_config(tmp_path, mnist_folder, search)
    runs = tmp_path / "runs"
    assert main(["search", str(config), "--trials", "2", "--expdir", str(runs)]) == 2
    printed = capsys.readouterr()
    assert "no trial completed" in printed.out
    assert "search failed: " in printed.err and "2 trials failed" in printed.err, printed.err
    assert "trials.csv" in printed.err and "Traceback" not in printed.err
    (search_dir,) = (runs / "searches").glob("*/*")
    assert (search_dir / "trials.csv").is_file() and (search_dir / "search.html").is_file()
    # Its study still has no result, resumed or not; a new search that ran no trial (its
    # time limit passed first) failed nothing: status 0.
    resume = ["search", "--resume", str(search_dir), "--trials", "3", "--timeout", "1e-9"]
    assert main(resume) == 2
    capsys.readouterr()
    fresh = ["search", str(config), "--trials", "2", "--expdir", str(tmp_path / "again")]
    assert main([*fresh, "--timeout", "1e-9"]) == 0


def test_a_search_that_may_still_complete_a_trial_has_not_failed(tmp_path: Path) -> None:
    """A failed trial whose retry is queued (its process died, then the time limit passed),
    or another machine's trial still running: the search exited 2, "no trial completed"."""
    import optuna
    from optuna.trial import TrialState, create_trial

    from torchloom.search.results import SearchFailed, SearchResults, check_some_trial_completed

    def verdict(study: optuna.Study) -> bool:
        try:
            check_some_trial_completed(tmp_path, SearchResults(study, [], None, {}, ""))
            return True
        except SearchFailed:
            return False

    died = create_trial(
        state=TrialState.FAIL, user_attrs={"retried": 1}, params={}, distributions={}
    )
    queued = optuna.create_study()
    queued.add_trial(died)
    queued.enqueue_trial({}, user_attrs={"retry_from": 0})
    assert verdict(queued)
    running = optuna.create_study()
    running.add_trial(create_trial(state=TrialState.FAIL))
    running.add_trial(create_trial(state=TrialState.RUNNING))
    assert verdict(running)
    failed = optuna.create_study()
    failed.add_trial(died)  # retried: counted by its retry, which failed too
    failed.add_trial(create_trial(state=TrialState.FAIL))
    assert not verdict(failed)
