"""What `loom search`, `loom report` and `loom search-server` make of untrusted input: a
password in a storage URL is never printed, whatever the path."""

from __future__ import annotations

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
