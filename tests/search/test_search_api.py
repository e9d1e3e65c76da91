"""`torchloom.search(...)`: a YAML config with a space given as a mapping, and a code-first
builder whose `hp.float` / `hp.int` / `hp.choice` calls are the space."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from search_helpers import tiny_config

import torchloom
from torchloom.config import load_config
from torchloom.errors import ConfigError


def test_search_a_config_with_a_space_mapping(tmp_path: Path, mnist_folder: Path) -> None:
    config = tiny_config(tmp_path, mnist_folder)
    found = torchloom.search(
        config,
        space={
            "training.optimizer.lr": {"loguniform": [1.0e-4, 1.0e-2]},
            "training.optimizer.betas": {"choice": [[0.9, 0.999], [0.8, 0.99]]},
        },
        trials=2,
        expdir=str(tmp_path / "runs"),
    )
    assert [row["state"] for row in found.trials] == ["complete", "complete"]
    assert found.best_value == max(row["validation.accuracy"] for row in found.trials)
    assert set(found.best_params) == {"training.optimizer.lr", "training.optimizer.betas"}
    # a list choice is the list the config got, not Optuna's JSON text of it
    assert found.best_params["training.optimizer.betas"] in ([0.9, 0.999], [0.8, 0.99])
    assert found.best_config is not None and found.best_config.is_file()
    assert (found.search_dir / "space.yml").is_file()  # kept for --resume


def test_search_a_code_first_builder(tmp_path: Path, mnist_folder: Path) -> None:
    base = load_config(tiny_config(tmp_path, mnist_folder)).data

    def build(hp: Any) -> dict[str, Any]:
        config = yaml.safe_load(yaml.safe_dump(base))  # a fresh copy per trial
        config["training"]["optimizer"]["lr"] = hp.float("lr", 1e-4, 1e-2, log=True)
        config["training"]["dataloader"]["batch_size"] = hp.int("batch", 16, 32, step=16)
        config["training"]["optimizer"]["type"] = hp.choice("optimizer", ["Adam", "SGD"])
        return config

    found = torchloom.search(build, trials=2, seed=0, expdir=str(tmp_path / "runs"))
    assert len(found.trials) == 2
    assert set(found.best_params) == {"lr", "batch", "optimizer"}
    assert found.best_config is not None
    best = yaml.safe_load(found.best_config.read_text())
    assert best["training"]["optimizer"]["type"] == found.best_params["optimizer"]
    assert best["training"]["dataloader"]["batch_size"] == found.best_params["batch"]


def _builder(base: dict[str, Any], batch: tuple[int, int]) -> Any:
    def build(hp: Any) -> dict[str, Any]:
        config = yaml.safe_load(yaml.safe_dump(base))
        config["training"]["dataloader"]["batch_size"] = hp.int("batch", *batch, step=16)
        config["training"]["optimizer"]["type"] = hp.choice("optimizer", ["Adam", "SGD"])
        return config

    return build


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda hp: hp.int("batch", 256, 32), "parameter 'batch': low 256 is greater than high 32"),
        (lambda hp: hp.float("lr", 0.0, 0.1, log=True), "a log range must be above 0"),
        (lambda hp: hp.int("depth", 1, 8, step=0), "step must be a positive number, got 0"),
        (
            lambda hp: hp.choice("optimizer", []),
            "parameter 'optimizer': choice must be a non-empty list",
        ),
        # trials.csv's own columns: the parameter's value overwrote the trial's number.
        (lambda hp: hp.int("number", 1, 4), "parameter 'number': is a column of trials.csv"),
        (lambda hp: hp.choice("state", ["a", "b"]), "parameter 'state': is a column of"),
        (
            lambda hp: hp.float("validation.accuracy", 0.1, 0.2),
            "parameter 'validation.accuracy': has the monitor's name",
        ),
    ],
)
def test_a_code_first_range_optuna_would_refuse_names_its_line_before_anything_is_written(
    tmp_path: Path, mnist_folder: Path, call: Any, expected: str
) -> None:
    base = load_config(tiny_config(tmp_path, mnist_folder)).data

    def build(hp: Any) -> dict[str, Any]:
        call(hp)
        return base

    runs = tmp_path / "runs"
    with pytest.raises(ConfigError) as refused:
        torchloom.search(build, trials=2, expdir=str(runs))
    message = refused.value.format()
    assert expected in message and f"{Path(__file__).name}:" in message, message
    assert not runs.exists()  # before: Optuna's ValueError, a folder, a trial left running


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        # Taken for min: the worst trial was chosen as the best.
        ({"mode": "maximize", "monitor": "validation.accuracy"}, "mode: must be min or max"),
        # Every trial trained to its end, then failed "no finite value of validation.acc".
        ({"monitor": "validation.acc"}, "is not a statistic of this pipeline"),
        ({"trials": 0}, "trials: must be 1 or more"),
        ({"timeout": -5}, "timeout: must be a number of seconds above 0"),
    ],
)
def test_code_first_search_settings_are_checked_before_any_trial(
    tmp_path: Path, mnist_folder: Path, given: dict[str, Any], expected: str
) -> None:
    build = _builder(load_config(tiny_config(tmp_path, mnist_folder)).data, (16, 32))
    runs = tmp_path / "runs"
    with pytest.raises(ConfigError) as refused:
        torchloom.search(build, **{"trials": 2, **given}, expdir=str(runs))
    assert expected in refused.value.format()
    assert not runs.exists()


def test_a_code_first_grid_enumerates_the_builders_choices(
    tmp_path: Path, mnist_folder: Path
) -> None:
    base = load_config(tiny_config(tmp_path, mnist_folder)).data
    found = torchloom.search(
        _builder(base, (16, 32)), trials=4, sampler="grid", expdir=str(tmp_path / "runs")
    )
    tried = sorted((row["batch"], row["optimizer"]) for row in found.trials)
    assert tried == [(16, "Adam"), (16, "SGD"), (32, "Adam"), (32, "SGD")]

    def ranged(hp: Any) -> dict[str, Any]:
        hp.float("lr", 1e-4, 1e-2, log=True)
        return base

    with pytest.raises(ConfigError, match="parameter 'lr': is a continuous range"):
        torchloom.search(ranged, trials=2, sampler="grid", expdir=str(tmp_path / "grid"))

    def huge(hp: Any) -> dict[str, Any]:  # its dry run listed 10^12 values, for any sampler
        hp.int("seed", 0, 10**12)
        return base

    with pytest.raises(ConfigError, match=r"makes a grid of 1e\+12 points"):
        torchloom.search(huge, trials=2, sampler="grid", expdir=str(tmp_path / "huge"))


def test_a_resumed_search_through_the_api_refuses_what_it_would_ignore(
    tmp_path: Path, mnist_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A code-first resume dropped sampler, seed, ... in silence and kept the old timeout; a
    YAML one ignored the config and overrides given with it."""
    from torchloom.search.record import read_record

    config = tiny_config(tmp_path, mnist_folder)
    base = load_config(config).data

    def build(hp: Any) -> dict[str, Any]:
        built = yaml.safe_load(yaml.safe_dump(base))
        built["training"]["optimizer"]["lr"] = hp.float("lr", 1e-4, 1e-2, log=True)
        return built

    found = torchloom.search(build, trials=1, seed=0, expdir=str(tmp_path / "runs"))
    with pytest.raises(ConfigError, match="--sampler: cannot change a resumed search"):
        torchloom.search(build, trials=1, sampler="random", resume=found.search_dir)
    with pytest.raises(ConfigError, match="--seed: cannot change a resumed search"):
        torchloom.search(build, trials=1, seed=1, resume=found.search_dir)
    torchloom.search(build, trials=1, timeout=3600.0, resume=found.search_dir)
    assert read_record(found.search_dir).settings["timeout"] == 3600.0
    # The command line cannot call the builder: it says so ("config file: is a directory").
    from torchloom.cli.main import main

    assert main(["search", "--resume", str(found.search_dir), "--trials", "2"]) == 2
    assert "is a code-first search" in capsys.readouterr().err
    space = {"training.optimizer.lr": {"loguniform": [1.0e-4, 1.0e-2]}}
    yaml_search = torchloom.search(
        config, space=space, trials=1, expdir=str(tmp_path / "yaml")
    ).search_dir
    with pytest.raises(ConfigError, match="no config or overrides"):
        torchloom.search(config, trials=1, resume=yaml_search)
    with pytest.raises(ConfigError, match="no config or overrides"):
        torchloom.search(overrides=["training.seed=4"], trials=1, resume=yaml_search)


def test_a_builder_that_fails_in_a_trial_fails_that_trial_not_the_search(
    tmp_path: Path, mnist_folder: Path
) -> None:
    """Only a LoomError from the builder failed its trial: any other exception ended the
    search with a traceback, the trial left RUNNING and no trials.csv written."""
    base = load_config(tiny_config(tmp_path, mnist_folder)).data
    calls = []

    def build(hp: Any) -> dict[str, Any]:
        calls.append(1)
        config = yaml.safe_load(yaml.safe_dump(base))
        config["training"]["optimizer"]["lr"] = hp.float("lr", 1e-4, 1e-2, log=True)
        if len(calls) == 3:  # after the check's call, in the second trial
            raise KeyError("lr_schedule")
        return config

    found = torchloom.search(build, trials=2, seed=0, expdir=str(tmp_path / "runs"))
    assert [row["state"] for row in found.trials] == ["complete", "fail"]
    with open(found.search_dir / "trials.csv", encoding="utf-8") as file:
        failed = list(csv.DictReader(file))[1]
    assert "KeyError: 'lr_schedule'" in failed["reason"]


def test_a_builder_that_returns_no_config_is_told_what_to_return(tmp_path: Path) -> None:
    import torch

    def build(hp: Any) -> torch.nn.Module:
        return torch.nn.Linear(4, hp.int("width", 2, 8))

    with pytest.raises(ConfigError, match="returned Linear, not a config") as refused:
        torchloom.search(build, trials=1, expdir=str(tmp_path / "runs"))
    assert "type: my_module:MyModel" in refused.value.format()


def test_a_search_worker_sets_the_cublas_workspace_before_its_first_trial(
    tmp_path: Path, mnist_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cuBLAS reads CUBLAS_WORKSPACE_CONFIG at a process's first GPU matrix product, and a
    search worker runs every trial in one process: one whose space turns
    training.deterministic on after other trials ran would get it too late. The worker sets
    it before the first trial (when the environment has none)."""
    import torchloom.search.worker as worker

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # so that the test's end restores it
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    seen = []
    run_trial = worker.run_trial

    def observed(*args: Any, **kwargs: Any) -> Any:
        seen.append(os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
        return run_trial(*args, **kwargs)

    monkeypatch.setattr(worker, "run_trial", observed)
    space = {"training.optimizer.lr": {"loguniform": [1.0e-4, 1.0e-2]}}
    config = tiny_config(tmp_path, mnist_folder)
    torchloom.search(config, space=space, trials=1, expdir=str(tmp_path / "runs"))
    assert seen == [":4096:8"]


def test_a_worker_lets_go_of_each_trial_before_the_next(
    tmp_path: Path, mnist_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trials of a worker share its process: a trial that diverged is held in reference
    cycles by its exception's traceback (its model, optimizer, last batch: on a GPU, memory
    the next trial needs) until Python's full collection, and torch.compile keeps at most 8
    compilations of a model class's forward, after which later trials' models would run
    eagerly. Before each trial the previous one's pipeline is gone and dynamo starts afresh."""
    import weakref
    from dataclasses import replace

    import torch._dynamo  # as a trial with training.compile would have it

    import torchloom.search.worker as worker
    from torchloom.api import Hook

    pipelines: list[Any] = []
    alive_at_start: list[list[bool]] = []
    resets: list[int] = []
    monkeypatch.setattr(torch.compiler, "reset", lambda: resets.append(1))

    class KeepsAWeakReference(Hook):
        name = "weak_reference"

        def before_train(self, run: Any) -> None:
            pipelines.append(weakref.ref(run.pipeline))

    run_trial = worker.run_trial

    def observed(*args: Any, **kwargs: Any) -> Any:
        alive_at_start.append([reference() is not None for reference in pipelines])
        resets_before = len(resets)
        options = args[4]
        args = (*args[:4], replace(options, hooks=[*options.hooks, KeepsAWeakReference()]))
        try:
            return run_trial(*args, **kwargs)
        finally:
            assert len(resets) == resets_before  # reset between trials, not inside one

    monkeypatch.setattr(worker, "run_trial", observed)
    diverging = {"training.optimizer.lr": {"choice": [1.0e6]}}  # Adam at lr 1e6: NaN at once
    config = tiny_config(tmp_path, mnist_folder)
    found = torchloom.search(config, space=diverging, trials=3, expdir=str(tmp_path / "runs"))
    assert [row["state"] for row in found.trials] == ["fail"] * 3
    assert all("diverged" in str(row.get("reason")) for row in found.trials), found.trials
    assert alive_at_start == [[], [False], [False, False]]
    assert len(resets) == 3


def test_a_broken_gpu_is_told_on_a_torch_older_than_its_accelerator_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch.AcceleratorError came with torch 2.8 and torch.accelerator with 2.6, and the
    project allows torch 2.4: there, every trial that failed (a shape error, an out-of-memory)
    raised AttributeError in the check and ended the whole search."""
    import torch

    import torchloom.search.trial as trial_module

    monkeypatch.delattr(torch, "AcceleratorError")
    monkeypatch.delattr(torch, "accelerator")
    assert trial_module.gpu_answers()  # no GPU here: nothing to have broken
    assert not trial_module._device_failed(ValueError("shapes do not match"))
    monkeypatch.setattr(trial_module, "gpu_answers", lambda: False)
    assert not trial_module._device_failed(RuntimeError("mat1 and mat2 shapes cannot be"))
    failed = RuntimeError("CUDA error: an illegal memory access was encountered")
    try:
        raise ValueError("in a component") from failed
    except ValueError as wrapped:
        assert trial_module._device_failed(wrapped)


def test_a_trial_that_breaks_its_gpu_stops_the_worker_with_what_to_do(
    tmp_path: Path, mnist_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a device-side assert or an illegal memory access the process's CUDA context is
    unusable: every later trial of the worker would fail at once and be counted. The trial
    fails with its reason and the worker stops, saying how to go on (made here by raising
    torch's accelerator error from the first training step, on a GPU that no longer
    answers). An accelerator error that leaves the GPU answering fails its trial alone."""
    import torch

    import torchloom.search.trial as trial_module
    from torchloom.engine.trainer import TrainingLoop
    from torchloom.search.trial import DeviceUnusable

    def broken(self: Any, batch: Any) -> Any:
        raise torch.AcceleratorError("CUDA error: device-side assert triggered")

    monkeypatch.setattr(TrainingLoop, "train_step", broken)
    monkeypatch.setattr(trial_module, "gpu_answers", lambda: True)
    space = {"training.optimizer.lr": {"loguniform": [1.0e-4, 1.0e-2]}}
    config = tiny_config(tmp_path, mnist_folder)
    recovered = torchloom.search(config, space=space, trials=2, expdir=str(tmp_path / "first"))
    assert [row["state"] for row in recovered.trials] == ["fail", "fail"]
    monkeypatch.setattr(trial_module, "gpu_answers", lambda: False)
    with pytest.raises(DeviceUnusable, match="trial 0: left this process's GPU unusable") as error:
        torchloom.search(config, space=space, trials=3, expdir=str(tmp_path / "runs"))
    assert "device-side assert triggered" in str(error.value)
    assert "loom search --resume" in str(error.value)
    (search_dir,) = (tmp_path / "runs").glob("searches/*/*")  # the results so far: written
    with open(search_dir / "trials.csv", newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    assert [row["state"] for row in rows] == ["fail"]


def test_workers_on_a_machine_with_several_gpus_take_one_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--workers K` without `--device` (or with a bare `cuda`) ran every worker on GPU 0:
    out of memory there, the other GPUs idle. The workers now take the GPUs in turn; a
    device named in full, the host, or a one-GPU machine is left as asked."""
    import torch

    from torchloom.search.worker import worker_device

    current: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    assert [worker_device(None, w) for w in range(3)] == ["cuda:0", "cuda:1", "cuda:0"]
    assert worker_device("cuda", 1) == "cuda:1"
    assert (worker_device("cuda:1", 0), worker_device("cpu", 1)) == ("cuda:1", "cpu")
    # Each worker's GPU is its process's current one (the broken-GPU check reads that one).
    assert current == ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:1"]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert worker_device(None, 1) is None


def test_a_stop_an_earlier_search_of_this_process_took_does_not_stop_the_next(
    tmp_path: Path, mnist_folder: Path
) -> None:
    """The record of stop signals outlived a code-first search stopped by Ctrl-C: its resume,
    and any later search in the same process (a notebook), stopped at once, every time."""
    import signal

    from torchloom.signals import record_stop

    record_stop(signal.SIGINT)  # the Ctrl-C that stopped an earlier search here
    build = _builder(load_config(tiny_config(tmp_path, mnist_folder)).data, (16, 32))
    found = torchloom.search(build, trials=1, expdir=str(tmp_path / "runs"))
    assert [row["state"] for row in found.trials] == ["complete"]
