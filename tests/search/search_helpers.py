"""A LeNet-5 config on a few hundred MNIST images, for the search tests (a trial takes a
second or two); processes racing for a study's last trials."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torchloom

SOURCE = str(Path(torchloom.__file__).parents[1])
# A study's identity as a search records it (study.create_study), for studies made by tests.
IDENTITY = {"monitor": "validation.loss", "direction": "minimize", "digest": "race"}


def tiny_config(folder: Path, data: Path, search: str = "", epochs: int = 1) -> Path:
    """LeNet-5 on 256 training images, 64 validation images, 64 test images."""
    text = f"""\
default_configs: [loom://mnist/lenet5.yml]
name: tiny
training:
  task: {{data_folder: {data}, subset: 256}}
  dataloader: {{batch_size: 32}}
  seed: 3
  logging_interval: 4
  terminal_conditions: {{epoch_limit: {epochs}}}
validation:
  task: {{subset: 64}}
test:
  task: {{subset: 64}}
{search}"""
    path = folder / "tiny.yml"
    path.write_text(text, encoding="utf-8")
    return path


def claim_race(folder: Path, url: str, study: str, budget: int, mode: str) -> None:
    """Three processes claim the trials of `study` at once (claim_race.py), each in a folder
    of its own as on three machines; they must all end well."""
    env = {**os.environ, "PYTHONPATH": SOURCE}
    script = Path(__file__).with_name("claim_race.py")
    processes = []
    for index in range(3):
        (folder / f"machine{index}").mkdir()
        command = [sys.executable, str(script), url, study, str(budget)]
        command += [str(folder / f"machine{index}"), mode]
        processes.append(
            subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
    outputs = [process.communicate(timeout=120)[0].decode() for process in processes]
    assert [process.returncode for process in processes] == [0, 0, 0], outputs


def two_machines_search(
    folder: Path, data: Path, storage: str, trials: int = 4
) -> tuple[list[dict[str, str]], list[int]]:
    """Two `loom search` processes, each with its own --expdir as on two machines, share the
    study `shared` in `storage` for `trials` trials of a learning rate; both must end well.
    Returns the rows of the trials.csv written last (the whole study: the other machine may
    have seen a trial still running) and how many trial run folders each machine made."""
    search = "search:\n  training.optimizer.lr: {loguniform: [1.0e-4, 1.0e-2]}\n"
    config = tiny_config(folder, data, search)
    env = {**os.environ, "PYTHONPATH": SOURCE}
    machines = [folder / f"machine{index}" for index in range(2)]
    processes = [
        subprocess.Popen(
            [
                *(sys.executable, "-m", "torchloom.cli.main", "search", str(config)),
                *("--trials", str(trials), "--storage", storage, "--study", "shared"),
                *("--expdir", str(machine)),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for machine in machines
    ]
    outputs = [process.communicate(timeout=300)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    written = [path / "trials.csv" for m in machines for path in m.glob("searches/*/*")]
    with open(max(written, key=lambda path: path.stat().st_mtime_ns), newline="") as handle:
        final = list(csv.DictReader(handle))
    ran = [sum(1 for _ in machine.glob("searches/*/*/trials/*/*")) for machine in machines]
    return final, ran


def search_study(search_dir: Path) -> Any:
    """The optuna study of a search folder whose storage is its journal, opened directly."""
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    from torchloom.search.record import read_record

    record = read_record(search_dir)
    journal = record.storage_url(search_dir).removeprefix("journal:")
    storage = JournalStorage(JournalFileBackend(journal))
    return optuna.load_study(storage=storage, study_name=record.study)
