"""`dataloader.reservoir` combinations that cannot give a right result are refused by the
schema, so `loom check` reports them (naming the key) before any data is read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from torchloom import process
from torchloom.config.schema import validate_sections
from torchloom.errors import ConfigError
from toy_runs import toy_config, train, write


def where(*keys: str) -> str:
    return "cfg.yml:" + ".".join(keys)


def training(**extra: Any) -> dict[str, Any]:
    reservoir = {"size": 16, **extra.pop("reservoir", {})}
    dataloader = {"batch_size": 4, "reservoir": reservoir, **extra.pop("dataloader", {})}
    return {"task": {}, "dataloader": dataloader, **extra}


def refused(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as error:
        validate_sections(data, where)
    return str(error.value)


def test_a_reservoir_with_a_kfold_sampler_is_refused() -> None:
    """The reservoir stepped k-fold's sampler by its own virtual epochs, and kept samples of
    earlier folds: validation's held-out fold leaked into training."""
    message = refused({"training": training(sampler={"type": "kfold", "folds": 5})})
    assert "cfg.yml:training.dataloader.reservoir: training.dataloader.reservoir" in message
    assert "kfold" in message and "held-out" in message
    validate_sections({"training": training(sampler={"type": "subset", "fraction": 0.5})}, where)


def test_a_deterministic_run_with_a_reservoir_that_is_not_is_refused() -> None:
    """training.deterministic promised a run that depends on its seed, and the reservoir's
    fill order followed the workers' timing."""
    message = refused({"training": training(deterministic=True)})
    assert "cfg.yml:training.dataloader.reservoir.deterministic" in message
    assert "training.deterministic" in message and "deterministic: true" in message
    validate_sections(
        {"training": training(deterministic=True, reservoir={"deterministic": True})}, where
    )


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"training": training(reservoir={"workers": 100000})}, "training.dataloader.reservoir"),
        (
            {
                "training": {"task": {}},
                "validation": {"task": {}, "dataloader": {"num_workers": 100000}},
            },
            "validation.dataloader",
        ),
    ],
)
def test_worker_counts_beyond_the_machine_are_refused(data: dict[str, Any], key: str) -> None:
    """100000 workers passed loom check, and the run forked until the machine gave out."""
    message = refused(data)
    assert f"cfg.yml:{key}" in message and "100000" in message
    assert "at most" in message
    for workers in (8, 64):
        validate_sections({"training": training(reservoir={"workers": workers})}, where)
        validate_sections({"training": {"task": {}, "dataloader": {"num_workers": workers}}}, where)


@pytest.mark.parametrize(
    ("dataloader", "key"),
    [({"num_workers": 4}, "num_workers"), ({"persistent_workers": True}, "persistent_workers")],
)
def test_loader_worker_keys_a_reservoir_ignores_are_refused(
    dataloader: dict[str, Any], key: str
) -> None:
    """With a reservoir, training's batches come from its workers: these keys were silently
    ignored (a user who set num_workers: 8 trained with reservoir.workers' default 2)."""
    message = refused({"training": training(dataloader=dataloader)})
    assert f"cfg.yml:training.dataloader.{key}: training.dataloader.{key}" in message
    assert "reservoir.workers" in message


@pytest.mark.parametrize("section", ["validation", "test"])
def test_a_reservoir_outside_training_is_refused_by_loom_check(section: str) -> None:
    """It was refused only when a run started (the loader), after loom check passed it."""
    data = {"training": {"task": {}}, section: training()}
    message = refused(data)
    assert f"cfg.yml:{section}.dataloader.reservoir: {section}.dataloader.reservoir" in message
    assert "training only" in message


def test_a_trained_run_s_loader_settings_do_not_stop_its_evaluation(tmp_path: Path) -> None:
    """A run trained before these keys were refused (num_workers inherited from a default
    config, and ignored) could no longer be processed or exported: what concerns training's
    loading only is left out when a trained run is read."""
    data = {"training": training(dataloader={"num_workers": 2})}
    assert "num_workers" in refused(data)
    validate_sections(data, where, for_training=False)
    config = toy_config(epochs=1, dataloader={"batch_size": 8, "reservoir": {"size": 16}})
    run = train(write(tmp_path, config), tmp_path / "runs").run_dir
    written = run / "config.yaml"
    written.write_text(
        written.read_text().replace("batch_size: 8\n", "batch_size: 8\n    num_workers: 2\n", 1)
    )
    assert "num_workers: 2" in written.read_text()
    processed = process(run, section="validation", expdir=str(tmp_path / "processed"))
    assert processed.statistics["samples"] == 16
