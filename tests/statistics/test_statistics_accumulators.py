"""Loss accumulators and statistics CSV files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from torchloom.statistics import accumulators
from torchloom.statistics.accumulators import RunningStats
from torchloom.statistics.csv_log import CsvLog


@pytest.mark.parametrize("count", [1, 7, accumulators.FOLD_EVERY + 5])
def test_running_stats_match_numpy_across_folds(count: int) -> None:
    values = torch.rand(count, generator=torch.Generator().manual_seed(count)) * 10
    stats = RunningStats()
    for value in values:
        stats.add(value)
    got = stats.values("loss")
    expected = values.double().numpy()
    assert got["loss"] == pytest.approx(expected.mean())
    assert got["loss_min"] == pytest.approx(expected.min())
    assert got["loss_max"] == pytest.approx(expected.max())
    assert got["loss_std"] == pytest.approx(expected.std(), abs=1e-9)


def test_running_stats_state_round_trip_continues_the_same_totals() -> None:
    first, second = torch.arange(5.0), torch.arange(5.0, 12.0)
    whole, part = RunningStats(), RunningStats()
    for value in torch.cat([first, second]):
        whole.add(value)
    for value in first:
        part.add(value)
    resumed = RunningStats()
    resumed.load_state_dict(part.state_dict(), torch.device("cpu"))
    for value in second:
        resumed.add(value)
    assert resumed.values("loss") == pytest.approx(whole.values("loss"))
    assert RunningStats().values("loss") == {}


def test_csv_log_extends_columns_and_truncates_on_resume(tmp_path: Path) -> None:
    path = tmp_path / "stats.csv"
    log = CsvLog(path)
    log.write({"episode": 1, "loss": 0.5})
    log.write({"episode": 2, "loss": 0.25, "accuracy": 0.9})  # a new column
    log.write({"episode": 3, "loss": 0.125, "accuracy": 0.95})
    rows = CsvLog(path).rows()
    assert [r["episode"] for r in rows] == ["1", "2", "3"]
    assert rows[0]["accuracy"] == "" and rows[1]["accuracy"] == "0.9"
    resumed = CsvLog(path, keep_until_episode=2)  # rows a killed run wrote past its checkpoint
    assert [r["episode"] for r in resumed.rows()] == ["1", "2"]
    resumed.write({"episode": 3, "loss": 0.1, "accuracy": 0.96})
    assert np.isclose(float(CsvLog(path).rows()[-1]["loss"]), 0.1)
