"""Command-line overrides in Hydra's grammar: every form and each of its errors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from torchloom.config import load_config
from torchloom.errors import ConfigError

BASE = """\
training:
  optimizer: {type: Adam, lr: 0.1}
  dataloader: {batch_size: 64, shuffle: true}
  layers: [1, 2]
pipeline:
  accuracy: {type: AccuracyStatistics}
  model: {type: LeNet5}
seed: ???
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "cfg.yml"
    path.write_text(BASE, encoding="utf-8")
    return path


def load(config_file: Path, *overrides: str) -> dict[str, Any]:
    return load_config(config_file, [*overrides, "++seed=0"]).data


def error_of(config_file: Path, *overrides: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(config_file, [*overrides, "++seed=0"])
    return str(caught.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.01", 0.01),
        ("1e-3", 1e-3),
        ("5", 5),
        ("true", True),
        ("null", None),
        ("[1, 2]", [1, 2]),
        ("{a: 1}", {"a": 1}),
        ("hello", "hello"),
        ("'quoted: text'", "quoted: text"),
        ("", ""),
    ],
)
def test_set_parses_values_as_yaml(config_file: Path, text: str, expected: Any) -> None:
    data = load(config_file, f"pipeline.model.type={text}")
    assert data["pipeline"]["model"]["type"] == expected


def test_set_existing_nested_key(config_file: Path) -> None:
    data = load(config_file, "training.optimizer.lr=0.01")
    assert data["training"]["optimizer"] == {"type": "Adam", "lr": 0.01}


def test_set_fills_a_mandatory_value(config_file: Path) -> None:
    assert load_config(config_file, ["seed=7"]).data["seed"] == 7


def test_set_mapping_merges_into_mapping_and_list_replaces(config_file: Path) -> None:
    data = load(config_file, "training.optimizer={lr: 0.5, momentum: 0.9}", "training.layers=[7]")
    assert data["training"]["optimizer"] == {"type": "Adam", "lr": 0.5, "momentum": 0.9}
    assert data["training"]["layers"] == [7]


def test_overrides_apply_in_order(config_file: Path) -> None:
    data = load(config_file, "training.optimizer.lr=1", "training.optimizer.lr=2")
    assert data["training"]["optimizer"]["lr"] == 2


def test_set_unknown_key_suggests_close_key_and_plus_form(config_file: Path) -> None:
    message = error_of(config_file, "training.optimizer.lrr=0.01")
    assert "unknown override key 'training.optimizer.lrr'" in message
    assert "did you mean 'lr'?" in message
    assert "+training.optimizer.lrr=0.01" in message


def test_set_unknown_parent_key_names_the_level(config_file: Path) -> None:
    message = error_of(config_file, "trainin.optimizer.lr=0.01")
    assert "unknown override key 'trainin.optimizer.lr'" in message
    assert "did you mean 'training'?" in message


def test_add_new_key_creating_parents(config_file: Path) -> None:
    data = load(config_file, "+pipeline.viewer.type=StreamViewer", "+training.optimizer.wd=0")
    assert data["pipeline"]["viewer"] == {"type": "StreamViewer"}
    assert data["training"]["optimizer"]["wd"] == 0


def test_add_existing_key_suggests_plain_form(config_file: Path) -> None:
    message = error_of(config_file, "+training.optimizer.lr=0.5")
    assert "'training.optimizer.lr' already exists" in message
    assert "'training.optimizer.lr=0.5'" in message
    assert "++training.optimizer.lr=0.5" in message


def test_add_or_set_does_both(config_file: Path) -> None:
    data = load(config_file, "++training.optimizer.lr=0.5", "++training.new_key=x")
    assert data["training"]["optimizer"]["lr"] == 0.5
    assert data["training"]["new_key"] == "x"


def test_delete_existing_key(config_file: Path) -> None:
    data = load(config_file, "~pipeline.accuracy", "~training.optimizer.lr")
    assert data["pipeline"] == {"model": {"type": "LeNet5"}}
    assert data["training"]["optimizer"] == {"type": "Adam"}


def test_delete_with_value_checks_the_value(config_file: Path) -> None:
    data = load(config_file, "~training.optimizer.type=Adam")
    assert "type" not in data["training"]["optimizer"]
    message = error_of(config_file, "~training.optimizer.type=SGD")
    assert "~training.optimizer.type=SGD" in message and "not deleted" in message


def test_delete_missing_key_suggests_close_key(config_file: Path) -> None:
    message = error_of(config_file, "~pipeline.acuracy")
    assert "unknown override key 'pipeline.acuracy'" in message
    assert "did you mean 'accuracy'?" in message


def test_key_below_a_non_mapping_is_an_error(config_file: Path) -> None:
    message = error_of(config_file, "+training.layers.extra=1")
    assert "'training.layers' is a list, not a mapping" in message


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ("training.optimizer.lr", "expected KEY=VALUE"),
        ("+pipeline.viewer", "expected KEY=VALUE"),
        ("=5", "malformed key"),
        ("++=5", "malformed key"),
        ("~", "malformed key"),
        ("training..lr=1", "malformed key"),
        ("training.optimizer.lr=[1, 2", "invalid YAML value"),
        ("training.optimizer.lr={a: 1, a: 2}", "duplicate key"),
        ("training.layers[0]=3", "list indices"),
        ("default_configs=[x.yml]", "cannot be changed"),
        ("training.optimizer.lr=${oops", "no viable alternative"),
    ],
)
def test_malformed_override_quotes_it(config_file: Path, override: str, reason: str) -> None:
    message = error_of(config_file, override)
    assert f"override '{override}'" in message
    assert reason in message


def test_all_bad_overrides_are_reported_together(config_file: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(config_file, ["nope=1", "+seed=1", "~gone", "broken"])
    subjects = [problem.subject for problem in caught.value.problems]
    assert subjects == [f"override '{text}'" for text in ("nope=1", "+seed=1", "~gone", "broken")]


def test_override_value_may_interpolate(config_file: Path) -> None:
    data = load(config_file, "+training.eval_batch=${training.dataloader.batch_size}")
    assert data["training"]["eval_batch"] == 64


def test_single_string_is_one_override(config_file: Path) -> None:
    assert load_config(config_file, "seed=3").overrides == ["seed=3"]


def test_a_key_a_section_schema_declares_is_set_without_plus(config_file: Path) -> None:
    # As Hydra does with a structured config: the schema knows them, the files need not set them.
    overrides = ["training.seed=7", "training.terminal_conditions.early_stopping.patience=5"]
    cfg = load_config(config_file, [*overrides, "++seed=0"])
    assert cfg.data["training"]["seed"] == 7
    assert cfg.data["training"]["terminal_conditions"] == {"early_stopping": {"patience": 5}}
    assert cfg.where("training", "seed") == "command-line override 'training.seed=7'"


@pytest.mark.parametrize(
    ("override", "hint"),
    [
        # a component's parameters: its schema is only known when the pipeline is built
        ("pipeline.model.dropout=0.1", "+pipeline.model.dropout=0.1"),
        # a torch argument: not part of the section schema
        ("training.optimizer.momentum=0.9", "+training.optimizer.momentum=0.9"),
        # a misspelt schema key is suggested from the schema, not only from the file
        ("training.sed=7", "did you mean 'seed'?"),
    ],
)
def test_a_key_outside_the_section_schemas_still_needs_plus(
    config_file: Path, override: str, hint: str
) -> None:
    message = error_of(config_file, override)
    assert f"unknown override key '{override.split('=')[0]}'" in message
    assert hint in message


def test_only_a_whole_key_path_the_schemas_declare_needs_no_plus(tmp_path: Path) -> None:
    path = tmp_path / "bare.yml"
    path.write_text("training:\n  optimizer: {type: Adam}\n", encoding="utf-8")
    data = load_config(path, ["test.dataloader.batch_size=8"]).data
    assert data["test"] == {"dataloader": {"batch_size": 8}}
    for override in ("pipeline.viewer.type=StreamViewer", "training.seed.extra=1"):
        with pytest.raises(ConfigError, match=re.escape(f"To add a new key write '+{override}'")):
            load_config(path, [override])


def test_an_item_of_a_list_is_set_by_its_position(config_file: Path) -> None:
    """`a.b.1=x` changes the second item of the list `a.b` (how a search addresses one edge
    of a genotype); items of nested lists too."""
    data = load(config_file, "training.layers.1=5", "++training.layers.0=[3, 4]")
    assert data["training"]["layers"] == [[3, 4], 5]
    data = load(config_file, "training.layers.0=[3, 4]", "training.layers.0.1=9")
    assert data["training"]["layers"] == [[3, 9], 2]


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ("training.layers.2=3", "'training.layers' is a list of 2 items (positions 0 to 1)"),
        ("++training.layers.7=3", "'training.layers' is a list of 2 items"),
        ("+training.layers.0=3", "key 'training.layers.0' already exists"),
        ("~training.layers.0", "an item of a list cannot be deleted"),
    ],
)
def test_list_positions_that_do_not_exist_are_errors(
    config_file: Path, override: str, reason: str
) -> None:
    message = error_of(config_file, override)
    assert reason in message


@pytest.mark.parametrize("segment", ["²", "\u0661"])
def test_a_list_index_is_written_in_ascii_digits(tmp_path: Path, segment: str) -> None:
    """`²` passed str.isdigit and failed int() (a ValueError, exit 1); an Arabic-Indic one (U+0661)
    was silently read as index 1."""
    path = tmp_path / "lists.yml"
    path.write_text("name: x\nlayers: [1, 2]\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="is a list, not a mapping"):
        load_config(path, [f"layers.{segment}=5"])
    path.write_text("name: x\nlayers: [1, 2]\nsize: ${layers.²}\n", encoding="utf-8")
    with pytest.raises(ConfigError):
        load_config(path)
