"""Options that a command would not use, or values it cannot honour, are refused before
anything is read or written (exit 2, the option named): each was taken without a word, or
ended in a traceback, or served on an address no one could reach."""

from __future__ import annotations

from pathlib import Path

import pytest
from loom_cli_harness import assert_user_error, run_loom

from torchloom.config import load_config
from torchloom.errors import ConfigError
from torchloom.search.checking import read_space
from torchloom.search.settings import read_settings

SPACE = "search:\n  training.optimizer.lr: {choice: [0.001, 0.01]}\n"
CONFIG = "default_configs: [loom://mnist/lenet5.yml]\n"


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        # A resumed run continues in its own folder: both were dropped.
        (["train", "--resume", "RUN", "--tag", "x"], "--tag with --resume"),
        (["train", "--resume", "RUN", "--expdir", "elsewhere"], "--expdir with --resume"),
        (["search", "--resume", "SEARCH", "--expdir", "elsewhere"], "--expdir"),
        # Options of another mode.
        (["quantize", "RUN", "--mode", "dynamic", "--qat-epochs", "3"], "--qat-epochs"),
        (["quantize", "RUN", "--mode", "static", "--qat-lr", "0.1"], "--qat-lr"),
        (["quantize", "RUN", "--mode", "dynamic", "--calibration-batches", "4"], "--calibration"),
        # Named training.optimizer.lr, a key the user never wrote.
        (["quantize", "RUN", "--mode", "qat", "--qat-lr", "nan"], "--qat-lr"),
        (["export", "RUN", "--format", "pt2", "--opset", "17"], "--opset"),
        # A traceback after the search folder was made; the default name, silently.
        (["search", "CONFIG", "--seed", "-1"], "--seed"),
        (["search", "CONFIG", "--seed", str(2**32)], "--seed"),
        (["search", "CONFIG", "--study", ""], "--study"),
        # "Serving" on grpc://127.0.0.1:-1 until killed.
        (["search-server", "sqlite:///unused.db", "--port", "-1"], "--port"),
        (["search-server", "sqlite:///unused.db", "--port", "70000"], "--port"),
    ],
)
def test_an_option_the_command_would_not_honour_is_refused(
    argv: list[str],
    option: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert_user_error(run_loom(capsys, *argv), option)
    assert list(tmp_path.iterdir()) == [], "nothing is written"


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"timeout": float("nan")}, "search setting 'timeout': must be a positive number"),
        ({"timeout": float("inf")}, "search setting 'timeout': must be a positive number"),
        ({"trials": float("inf")}, "search setting 'trials': must be a positive number"),
        ({"trials": float("nan")}, "search setting 'trials': must be a positive number"),
    ],
)
def test_a_search_budget_that_is_no_finite_number_is_refused(
    given: dict[str, float], message: str, tmp_path: Path
) -> None:
    """--timeout nan ran without a limit and wrote NaN into search.json; `trials: .inf` and
    `.nan` in a search section ended in OverflowError and ValueError tracebacks."""
    config = tmp_path / "search.yml"
    config.write_text(CONFIG + SPACE, encoding="utf-8")
    space = read_space(load_config(config), None)
    with pytest.raises(ConfigError) as refused:
        read_settings(space, given)
    assert message in refused.value.format()
    assert read_settings(space, {"trials": 10**400}).trials == 10**400  # no OverflowError


def test_search_server_errors_name_what_the_user_gave(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """They named --storage, an option `loom search-server` does not have."""
    url = f"sqlite:///{tmp_path / 'missing' / 'studies.db'}"
    result = run_loom(capsys, "search-server", url, "--port", "1")
    assert_user_error(result, "DATABASE_URL", "cannot open the SQLite database")
    assert "--storage" not in result.err
