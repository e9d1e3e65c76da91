"""Sharded checkpoints (`training.distributed.strategy: fsdp`): the weights, optimizer states
and unfinished gradients of `last.pt` written by every process through
`torch.distributed.checkpoint` (DCP), each its own shard, and read back at any number of
processes (DCP reshards on load).

Layout of a run's `checkpoints/` folder:

    last.pt, last.prev.pt   progress, RNG, statistics, scheduler, ... as always, plus a
                            `sharded` record: the shard folder's name and the SHA-256 of each
                            of its files (covered by last.pt's own digest)
    shards/<name>/          one DCP checkpoint (`.metadata`, `__<rank>_0.distcp`), named by
                            episode and a random tag, so a new save never touches a folder
                            that last.pt or last.prev.pt names; folders neither names are
                            removed after a save
    best.pt                 whole weights (gathered to rank 0): best.pt is for one process
                            (the test pass, `loom process`, analysis), never resumed from

The integrity rules of engine/checkpoint.py hold: a shard file that does not match its digest
makes last.pt damaged, and resume falls back to last.prev.pt with its own shard folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from torchloom.data.atomic_files import sync_folder
from torchloom.engine.distributed import Distributed

SHARDS = "shards"
RECORD = "sharded"
_META = ".metadata"


def _dcp() -> Any:
    import torch.distributed.checkpoint as dcp

    return dcp


@contextlib.contextmanager
def _quietly() -> Iterator[None]:
    """DCP warns that it 'assumes a single process' when none is initialised: so it is."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        yield


def file_digests(folder: Path) -> dict[str, str]:
    digests = {}
    for path in sorted(folder.iterdir()):
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        digests[path.name] = digest.hexdigest()
    return digests


def save_shards(
    checkpoints: Path,
    root: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    dist: Distributed,
    episode: int,
    gradients: bool,
) -> dict[str, Any] | None:
    """Every process writes its shard of `root`'s weights, the optimizer's states and (with
    `gradients`) the gradients of an unfinished accumulation window. Collective. Returns the
    record for last.pt on rank 0 (None on the others)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    name = dist.broadcast(f"e{episode:09d}-{secrets.token_hex(3)}")
    final = checkpoints / SHARDS / name
    staging = final.with_name(f"{name}.part")
    # Before its first step an optimizer has no states, and DCP would make them with a step
    # of zero gradients (Adam's step count would change what the run computes): none saved.
    with_optimizer = bool(optimizer.state)
    if with_optimizer:
        model, optim = get_state_dict(root, optimizer)
        state: dict[str, Any] = {"model": model, "optim": optim}
    else:
        state = {"model": get_model_state_dict(root)}
    extra = _split_extra(state["model"])
    if gradients:
        state["gradients"] = {n: p.grad for n, p in root.named_parameters() if p.grad is not None}
    if dist.main:
        final.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
    dist.broadcast(None)  # the folder is clean before anyone writes
    with _quietly():
        _dcp().save(state, checkpoint_id=staging, no_dist=not dist.active)
    # DCP returns once rank 0 wrote .metadata, after every process reported its shard written.
    if not dist.main:
        return None
    staging.rename(final)
    sync_folder(final.parent)
    return {
        "folder": f"{SHARDS}/{name}",
        "files": file_digests(final),
        "optimizer": with_optimizer,
        "gradients": sorted(state.get("gradients", {})),
        "extra_states": extra,
    }


def load_shards(
    checkpoints: Path,
    record: dict[str, Any],
    root: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    dist: Distributed,
) -> None:
    """Read a sharded checkpoint into `root` and `optimizer` at this run's number of
    processes (whatever it was saved with). Collective."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    folder = checkpoints / record["folder"]
    if record["optimizer"]:
        model, optim = get_state_dict(root, optimizer)
        state: dict[str, Any] = {"model": model, "optim": optim}
    else:
        state = {"model": get_model_state_dict(root)}
    _split_extra(state["model"])
    parameters = dict(root.named_parameters())
    if record["gradients"]:
        state["gradients"] = {n: torch.zeros_like(parameters[n]) for n in record["gradients"]}
    with _quietly():
        _dcp().load(state, checkpoint_id=folder, no_dist=not dist.active)
    state["model"].update(record["extra_states"])
    if record["optimizer"]:
        set_state_dict(
            root, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
    else:
        set_model_state_dict(root, state["model"])
    for name, gradient in state.get("gradients", {}).items():
        parameters[name].grad = gradient


def _split_extra(model: dict[str, Any]) -> dict[str, Any]:
    """Take the modules' extra states (`get_extra_state`: vocabularies, plain values) out of
    a model state dict: DCP would flatten a dict into keys and load back only the keys the
    receiving module already has. They are small and the same on every process, so last.pt
    keeps them whole."""
    return {key: model.pop(key) for key in [k for k in model if k.endswith("_extra_state")]}


def damage(checkpoints: Path, record: dict[str, Any]) -> str | None:
    """What is wrong with a checkpoint's shard folder (missing, a file changed), else None."""
    folder = checkpoints / record["folder"]
    if not folder.is_dir():
        return f"its shard folder {record['folder']}/ is missing"
    found = file_digests(folder)
    for file, digest in record["files"].items():
        if found.get(file) != digest:
            what = "is missing" if file not in found else "does not match its SHA-256 digest"
            return f"the shard file {record['folder']}/{file} {what}"
    return None


def _component_states(flat: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """`{"model.linear.weight": t}` (the pipeline's module paths) as checkpoints keep
    components: `{"model": {"linear.weight": t}}`."""
    nested: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        component, _, rest = key.partition(".")
        nested.setdefault(component, {})[rest] = value
    return nested


def _model_entries(folder: Path) -> dict[str, Any]:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = _dcp().FileSystemReader(str(folder)).read_metadata()
    entries = {}
    for key, item in metadata.state_dict_metadata.items():
        if key.startswith("model."):
            entries[key[len("model.") :]] = item
    # Tensors only: extra states are kept in last.pt (_split_extra).
    return {k: v for k, v in entries.items() if isinstance(v, TensorStorageMetadata)}


def shape_components(checkpoints: Path, record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The components' weights as meta tensors (shapes and dtypes, no data), for checking
    that a sharded checkpoint fits a pipeline before anything is read."""
    entries = _model_entries(checkpoints / record["folder"])
    return _component_states(
        {
            key: torch.empty(item.size, dtype=item.properties.dtype, device="meta")
            for key, item in entries.items()
        }
        | record["extra_states"]
    )


def whole_components(checkpoints: Path, record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The components' whole weights, read from every shard by this one process."""
    folder = checkpoints / record["folder"]
    entries = _model_entries(folder)
    model: dict[str, Any] = {
        key: torch.empty(item.size, dtype=item.properties.dtype) for key, item in entries.items()
    }
    with _quietly():
        _dcp().load({"model": model}, checkpoint_id=folder, no_dist=True)
    return _component_states({**model, **record["extra_states"]})


def prune_shards(checkpoints: Path, keep: set[str]) -> None:
    """Remove shard folders no checkpoint names (`keep`: the `folder` of last.pt's and
    last.prev.pt's records), staging folders of interrupted saves included."""
    folder = checkpoints / SHARDS
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        if f"{SHARDS}/{entry.name}" not in keep:
            shutil.rmtree(entry, ignore_errors=True)


# ---- what the training loop calls ---------------------------------------------------------
def checkpoint_state(
    state: dict[str, Any],
    checkpoints: Path,
    root: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    dist: Distributed,
    last: bool,
    gradients: bool,
) -> dict[str, Any]:
    """A sharded run's checkpoint content (collective): for last.pt the shards written and
    their record; for best.pt the whole weights, gathered to rank 0."""
    if last:
        record = save_shards(
            checkpoints, root, optimizer, dist, state["progress"]["episode"], gradients
        )
        return {**state, RECORD: record}
    return {**state, "components": whole_states(root)}


def whole_states(root: torch.nn.Module) -> dict[str, dict[str, Any]]:
    """The whole weights of every component, on the CPU, on rank 0 (empty on the others).
    Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return _component_states(get_model_state_dict(root, options=options))


def load_whole(root: torch.nn.Module, components: dict[str, dict[str, Any]]) -> None:
    """Whole weights (best.pt's, which every process read) into sharded components."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    flat = {
        f"{name}.{key}": value for name, state in components.items() for key, value in state.items()
    }
    set_model_state_dict(root, flat, options=StateDictOptions(full_state_dict=True, strict=False))


def prune_unused(checkpoints: Path) -> None:
    """After last.pt is saved (rank 0): remove the shard folders neither last.pt nor
    last.prev.pt names."""
    keep = set()
    for name in ("last.pt", "last.prev.pt"):
        try:
            record = torch.load(checkpoints / name, map_location="cpu", weights_only=True).get(
                RECORD
            )
        except Exception:  # missing or damaged: it names nothing to keep
            continue
        if record:
            keep.add(record["folder"])
    prune_shards(checkpoints, keep)
