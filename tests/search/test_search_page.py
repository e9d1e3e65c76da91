"""search.html and `loom report SEARCH_DIR`, on a study written here (no training): every
plot drawn, pruned trials in the table and the curves, the page shown in headless Chromium
with every image loaded and no console message (where Debian's chromium is installed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import optuna
import pytest

from torchloom.cli.main import main
from torchloom.search.record import SearchRecord
from torchloom.search.study import journal_url, open_storage

CHROMIUM = Path("/usr/bin/chromium")
PROBE = """<script>window.addEventListener("load", () => {
  const images = [...document.images];
  const loaded = images.filter((i) => i.complete && i.naturalWidth > 0).length;
  document.body.setAttribute("data-images-loaded", loaded + "/" + images.length);
});</script>"""


@pytest.fixture
def search_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "searches" / "toy" / "20261126_120000"
    folder.mkdir(parents=True)
    record = SearchRecord(
        name="toy",
        study="toy",
        storage=journal_url(),
        monitor="validation.accuracy",
        mode="max",
        trials=12,
    )
    record.save(folder)
    study = optuna.create_study(
        storage=open_storage(record.storage_url(folder)),
        study_name="toy",
        direction="maximize",
        sampler=optuna.samplers.RandomSampler(seed=0),
    )
    for number in range(12):
        trial = study.ask()
        lr = trial.suggest_float("training.optimizer.lr", 1e-4, 1e-1, log=True)
        batch = trial.suggest_categorical("training.dataloader.batch_size", [32, 64])
        accuracy = 0.0
        for epoch in range(1, 4):
            accuracy = 1 - lr * 5 - batch / 1000 - 0.1 / epoch
            trial.report(accuracy, epoch)
            if number % 4 == 3 and epoch == 2:
                trial.set_user_attr("reason", "pruned at step 2")
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                break
        else:
            trial.set_user_attr("config", f"name: toy\n# trial {number}\n")
            study.tell(trial, accuracy)
    return folder


def test_loom_report_writes_the_search_page(
    search_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(search_dir)]) == 0
    assert str(search_dir / "search.html") in capsys.readouterr().out
    page = (search_dir / "search.html").read_text()
    for name in ("importance", "slice", "history", "intermediate", "parallel"):
        assert (search_dir / "plots" / f"{name}.png").is_file(), name
    assert page.count("<img") == 5
    assert "pruned at step 2" in page and "9 complete, 3 pruned" in page
    best = (search_dir / "best.yml").read_text()
    assert best.startswith("# The best trial (") and "name: toy" in best
    rows = (search_dir / "trials.csv").read_text().splitlines()
    assert len(rows) == 13 and rows[0].startswith("number,state,validation.accuracy,")
    # `loom runs` lists the searches of an experiments folder too.
    assert main(["runs", str(search_dir.parents[2])]) == 0
    listed = capsys.readouterr().out
    assert "max validation.accuracy  9 complete, 3 pruned (of 12)" in listed


@pytest.mark.skipif(
    not CHROMIUM.exists(), reason="Debian chromium is not installed (make test installs it)"
)
def test_search_page_in_headless_chromium(search_dir: Path, tmp_path: Path) -> None:
    assert main(["report", str(search_dir)]) == 0
    page = search_dir / "search.html"
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    command = [
        str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
        "--virtual-time-budget=5000", "--dump-dom", probe.as_uri(),
    ]  # fmt: skip
    shown = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert 'data-images-loaded="5/5"' in shown.stdout, shown.stderr[-2000:]
    assert [line for line in shown.stderr.splitlines() if ":CONSOLE" in line] == []
