"""The YAML dialect of config files: floats, duplicate keys, syntax errors, top-level shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchloom.config import load_config
from torchloom.config.yaml_reader import parse_config_text, parse_yaml_value
from torchloom.errors import ConfigError


def load_text(tmp_path: Path, text: str, name: str = "cfg.yml") -> dict[str, object]:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return load_config(path).data


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1e-3", 1e-3),
        ("1.0e-3", 1e-3),
        ("1E5", 1e5),
        ("-2.5e+2", -250.0),
        ("1.0e3", 1000.0),
        (".5", 0.5),
        ("1_000.5", 1000.5),
        (".inf", float("inf")),
    ],
)
def test_scientific_notation_is_a_float(tmp_path: Path, text: str, expected: float) -> None:
    value = load_text(tmp_path, f"lr: {text}\n")["lr"]
    assert isinstance(value, float)
    assert value == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("10", 10), ("0x10", 16), ("true", True), ("null", None), ("1e", "1e"), ("e5", "e5")],
)
def test_other_scalars_keep_their_yaml_meaning(tmp_path: Path, text: str, expected: object) -> None:
    assert load_text(tmp_path, f"v: {text}\n")["v"] == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("064", 64),  # YAML 1.1: octal 52
        ("010", 10),
        ("0o17", 15),
        ("1_000", 1000),
        ("1:40", "1:40"),  # YAML 1.1: 100, in base 60
        ("1:30.5", "1:30.5"),
        ("no", "no"),  # YAML 1.1: False (Norwegian's language code)
        ("on", "on"),
        ("yes", "yes"),
        ("False", False),
    ],
)
def test_integers_and_booleans_are_yaml_1_2_s(tmp_path: Path, text: str, expected: object) -> None:
    value = load_text(tmp_path, f"v: {text}\n")["v"]
    assert value == expected and type(value) is type(expected)
    assert parse_yaml_value(text) == expected


def test_an_integer_too_long_to_read_is_an_error_at_its_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_text(tmp_path, "name: x\nbig: " + "1" * 5000 + "\n", name="big.yml")
    assert "big.yml:2" in str(caught.value) and "cannot read this integer" in str(caught.value)


def test_dates_stay_strings(tmp_path: Path) -> None:
    assert load_text(tmp_path, "day: 2024-01-31\n") == {"day": "2024-01-31"}


def test_merge_keys_are_not_duplicates(tmp_path: Path) -> None:
    text = "base: &b {x: 1, y: 2}\nderived:\n  <<: *b\n  y: 3\n"
    assert load_text(tmp_path, text)["derived"] == {"x": 1, "y": 3}


def test_duplicate_key_names_file_and_second_line(tmp_path: Path) -> None:
    text = "training:\n  lr: 0.1\n  batch_size: 4\n  lr: 0.2\n"
    with pytest.raises(ConfigError) as caught:
        load_text(tmp_path, text, name="dupes.yml")
    message = str(caught.value)
    assert "dupes.yml:4" in message
    assert "key 'lr'" in message and "line 2" in message


def test_every_duplicate_key_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_text(tmp_path, "a: 1\na: 2\nb: 1\nb: 2\n")
    assert len(caught.value.problems) == 2


def test_syntax_error_names_file_line_and_column(tmp_path: Path) -> None:
    text = "training:\n  lr: 0.1\n  layers: [1, 2\nseed: 3\n"
    with pytest.raises(ConfigError) as caught:
        load_text(tmp_path, text, name="broken.yml")
    message = str(caught.value)
    assert "broken.yml:4:5" in message
    assert "YAML syntax error" in message and "expected ',' or ']'" in message


def test_bad_indentation_is_a_syntax_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"bad\.yml:2:\d+.*YAML syntax error"):
        load_text(tmp_path, "a: 1\n  b: 2\n", name="bad.yml")


def test_two_documents_are_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"multi\.yml:2.*single document"):
        load_text(tmp_path, "a: 1\n---\nb: 2\n", name="multi.yml")


@pytest.mark.parametrize(("text", "kind"), [("- 1\n- 2\n", "a list"), ("hello\n", "a string")])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str, kind: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_text(tmp_path, text, name="notmap.yml")
    assert "notmap.yml" in str(caught.value)
    assert f"must be a mapping of keys to values, got {kind}" in str(caught.value)


def test_unsafe_tags_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unsafe\.yml:1:4: YAML value: .*python/object"):
        load_text(tmp_path, "x: !!python/object/apply:os.system ['true']\n", name="unsafe.yml")


def test_recursive_alias_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"loop\.yml:2.*alias"):
        load_text(tmp_path, "ok: 1\nitems: &x [1, *x]\n", name="loop.yml")


def test_lines_are_recorded_for_every_key_path() -> None:
    parsed = parse_config_text("a:\n  b: 1\n  c:\n    - x\n    - {d: 2}\n", "mem.yml")
    assert parsed.lines == {
        ("a",): 1,
        ("a", "b"): 2,
        ("a", "c"): 3,
        ("a", "c", "0"): 4,
        ("a", "c", "1"): 5,
        ("a", "c", "1", "d"): 5,
    }


def test_parse_yaml_value_reports_bad_yaml() -> None:
    assert parse_yaml_value("{a: [1, 2]}") == {"a": [1, 2]}
    with pytest.raises(ValueError, match="invalid YAML value"):
        parse_yaml_value("[1, 2")
