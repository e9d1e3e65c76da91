"""read_json: a record of a folder received from someone else, read within a size and with
every damage said in words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchloom.data.json_files import UnreadableJson, read_json

DEEP = "[" * 100_000 + "]" * 100_000  # Python's parser recursed past its limit on this


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (DEEP.encode(), "is nested too deeply to be a record torchloom wrote"),
        (b'{"status": "epoch_limit"', "is not valid JSON: Expecting"),
        (b"", "is not valid JSON"),
        (b'{"name": "caf\xe9"}', "is not UTF-8 text: invalid continuation byte"),
        (b'{"padding": "' + b" " * 300_000 + b'"}', "has 300,015 bytes, more than torchloom"),
    ],
    ids=["nested", "cut", "empty", "latin-1", "too-large"],
)
def test_every_damage_is_said_in_words(tmp_path: Path, content: bytes, said: str) -> None:
    path = tmp_path / "record.json"
    path.write_bytes(content)
    with pytest.raises(UnreadableJson) as raised:
        read_json(path, max_bytes=300_000)
    assert said in str(raised.value)
    assert isinstance(raised.value, ValueError)  # readers that fall back on any ValueError


def test_a_record_within_the_size_is_read_and_a_missing_one_is_said(tmp_path: Path) -> None:
    path = tmp_path / "record.json"
    record = {"status": "epoch_limit", "labels": ["a", "b"]}
    path.write_text(json.dumps(record), encoding="utf-8")
    size = path.stat().st_size
    assert read_json(path, max_bytes=size) == record
    with pytest.raises(UnreadableJson, match=f"has {size} bytes, more than torchloom writes"):
        read_json(path, max_bytes=size - 1)
    with pytest.raises(UnreadableJson, match="cannot be read: No such file or directory"):
        read_json(tmp_path / "none.json")
