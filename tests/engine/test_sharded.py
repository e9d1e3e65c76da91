"""Sharded checkpoints in one process (no process group: DCP in-process): weights, optimizer
states, gradients and modules' extra states round-trip; shard files are checked against
their digests; folders no checkpoint names are removed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchloom.engine import sharded
from torchloom.engine.distributed import SINGLE


class WithVocabulary(nn.Module):
    def __init__(self, words: dict[str, int]) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 2)
        self.words = words

    def get_extra_state(self) -> dict[str, Any]:
        return {"words": dict(self.words)}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.words = state["words"]


def pipeline(seed: int, words: dict[str, int]) -> tuple[nn.ModuleDict, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    root = nn.ModuleDict({"encoder": WithVocabulary(words), "head": nn.Linear(2, 2)})
    return root, torch.optim.Adam(root.parameters(), lr=0.1)


def test_a_sharded_checkpoint_round_trips_in_one_process(tmp_path: Path) -> None:
    root, optimizer = pipeline(0, {"cat": 1, "dog": 2})
    root["head"](root["encoder"].linear(torch.ones(4, 3))).sum().backward()
    optimizer.step()
    root["head"](root["encoder"].linear(torch.ones(4, 3))).sum().backward()  # a window's grads
    record = sharded.save_shards(tmp_path, root, optimizer, SINGLE, 7, gradients=True)
    assert record is not None and record["optimizer"]
    assert record["extra_states"] == {"encoder._extra_state": {"words": {"cat": 1, "dog": 2}}}
    copy, copy_optimizer = pipeline(1, {})
    sharded.load_shards(tmp_path, record, copy, copy_optimizer, SINGLE)
    assert copy["encoder"].words == {"cat": 1, "dog": 2}
    for (name, mine), theirs in zip(root.named_parameters(), copy.parameters(), strict=True):
        assert torch.equal(mine, theirs), name
        assert mine.grad is not None and theirs.grad is not None
        assert torch.equal(mine.grad, theirs.grad), name
    assert copy_optimizer.state_dict()["state"][0]["step"] == 1
    whole = sharded.whole_components(tmp_path, record)
    assert torch.equal(whole["head"]["weight"], root["head"].weight)
    assert whole["encoder"]["_extra_state"] == {"words": {"cat": 1, "dog": 2}}
    shapes = sharded.shape_components(tmp_path, record)
    assert shapes["encoder"]["linear.weight"].shape == (2, 3)


def test_a_changed_shard_file_is_damage_and_unnamed_folders_are_pruned(tmp_path: Path) -> None:
    root, optimizer = pipeline(0, {})
    first = sharded.save_shards(tmp_path, root, optimizer, SINGLE, 1, gradients=False)
    second = sharded.save_shards(tmp_path, root, optimizer, SINGLE, 2, gradients=False)
    assert first is not None and second is not None
    assert sharded.damage(tmp_path, second) is None
    shard = tmp_path / second["folder"] / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert "does not match its SHA-256 digest" in (sharded.damage(tmp_path, second) or "")
    (tmp_path / "shards" / "e000000003-abc.part").mkdir()  # an interrupted save's staging
    sharded.prune_shards(tmp_path, {second["folder"]})
    assert {p.name for p in (tmp_path / "shards").iterdir()} == {second["folder"].split("/")[1]}
    assert "is missing" in (sharded.damage(tmp_path, first) or "")
