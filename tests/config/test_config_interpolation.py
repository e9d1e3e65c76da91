"""`${...}` interpolation and `???` markers, resolved after merging and overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchloom.config import load_config
from torchloom.errors import ConfigError


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def in_tmp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def test_key_interpolation_sees_the_merged_and_overridden_config(tmp_path: Path) -> None:
    write(tmp_path, "base.yml", "training:\n  dataloader: {batch_size: 64}\n")
    write(
        tmp_path,
        "top.yml",
        "default_configs: [base.yml]\n"
        "validation:\n  dataloader: {batch_size: '${training.dataloader.batch_size}'}\n"
        "name: run_${training.dataloader.batch_size}\n",
    )
    cfg = load_config("top.yml", ["training.dataloader.batch_size=8"])
    assert cfg.data["validation"] == {"dataloader": {"batch_size": 8}}
    assert cfg.data["name"] == "run_8"


def test_env_interpolation_with_and_without_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOM_TEST_DATA", "/data/here")
    monkeypatch.delenv("LOOM_TEST_UNSET", raising=False)
    write(
        tmp_path,
        "top.yml",
        "folder: ${oc.env:LOOM_TEST_DATA}\nother: ${oc.env:LOOM_TEST_UNSET,/fallback}\n",
    )
    assert load_config("top.yml").data == {"folder": "/data/here", "other": "/fallback"}


def test_missing_env_variable_names_key_file_line_and_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOOM_TEST_UNSET", raising=False)
    write(tmp_path, "top.yml", "a: 1\ndata:\n  folder: ${oc.env:LOOM_TEST_UNSET}\n")
    with pytest.raises(ConfigError) as caught:
        load_config("top.yml")
    message = str(caught.value)
    assert "top.yml:3" in message
    assert "key 'data.folder'" in message
    assert "${oc.env:LOOM_TEST_UNSET}" in message and "LOOM_TEST_UNSET' not found" in message


def test_missing_key_interpolation_in_an_include(tmp_path: Path) -> None:
    write(tmp_path, "base.yml", "x: 1\nsize: ${model.width}\n")
    write(tmp_path, "top.yml", "default_configs: [base.yml]\n")
    with pytest.raises(ConfigError) as caught:
        load_config("top.yml")
    message = str(caught.value)
    assert "base.yml:2" in message and "key 'size'" in message and "${model.width}" in message


def test_interpolation_cycle_reports_both_keys(tmp_path: Path) -> None:
    write(tmp_path, "top.yml", "a: ${b}\nb: ${a}\n")
    with pytest.raises(ConfigError) as caught:
        load_config("top.yml")
    assert [p.subject for p in caught.value.problems] == ["key 'a'", "key 'b'"]
    assert "Recursive interpolation" in str(caught.value)


def test_interpolation_set_by_override_points_at_override(tmp_path: Path) -> None:
    write(tmp_path, "top.yml", "a: 1\n")
    with pytest.raises(ConfigError, match=r"command-line override '\+b=\$\{nope\}'.*key 'b'"):
        load_config("top.yml", ["+b=${nope}"])


def test_failure_inside_a_list_names_the_index(tmp_path: Path) -> None:
    write(tmp_path, "top.yml", "layers:\n  - 1\n  - ${nope}\n")
    with pytest.raises(ConfigError, match=r"top\.yml:3.*key 'layers\[1\]'"):
        load_config("top.yml")


def test_invalid_interpolation_syntax_is_reported_at_its_line(tmp_path: Path) -> None:
    write(tmp_path, "top.yml", "a: 1\nb: ${unclosed\n")
    with pytest.raises(ConfigError, match=r"top\.yml:2.*key 'b'.*invalid interpolation"):
        load_config("top.yml")


def test_mandatory_missing_value(tmp_path: Path) -> None:
    write(tmp_path, "top.yml", "training:\n  optimizer:\n    lr: ???\nseed: ???\n")
    with pytest.raises(ConfigError) as caught:
        load_config("top.yml")
    message = str(caught.value)
    assert "mandatory value missing" in message
    assert "top.yml:3" in message and "key 'training.optimizer.lr'" in message
    assert "key 'seed'" in message
    assert len(caught.value.problems) == 2


def test_escaped_interpolation_stays_literal(tmp_path: Path) -> None:
    write(tmp_path, "top.yml", "template: 'cost: \\${price}'\n")
    assert load_config("top.yml").data == {"template": "cost: ${price}"}
