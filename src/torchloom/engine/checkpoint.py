"""Checkpoints: everything exact resume needs, written atomically, checked when read.

A checkpoint is a dict of tensors and plain values (loadable with `weights_only=True`):
component weights by name, optimizer, scheduler, grad scaler, RNG states, progress (epoch,
episode, position in the epoch), early-stopping state, the running statistics and the run's
config text. It carries a SHA-256 digest of its content, checked on load: a bit flipped on
the disk is an error, never a silently different run. It is written to a temporary file,
flushed to disk, then renamed over the old one; `last.pt`'s previous version is kept as
`last.prev.pt` (a hard link, so there is always a whole `last.pt`), and resume falls back to
it when `last.pt` is damaged.

Seeds and random-generator states live here too: they are what exact resume restores last
(states are kept as tensors and plain python values so checkpoints load with
`weights_only=True`).
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchloom.data.atomic_files import atomic_file, sync_folder
from torchloom.engine import sharded
from torchloom.errors import ConfigError, DataError, StorageError
from torchloom.signals import set_parent_death_signal

FORMAT_VERSION = 2
READABLE_FORMATS = (1, 2)  # format 1: before digests (still resumable)
DIGEST_KEY = "sha256"


def content_digest(state: Mapping[str, Any]) -> str:
    """SHA-256 over the checkpoint's content: every tensor's dtype, shape and bytes, and the
    plain values' reprs, in order. Computed on what is saved and on what is loaded back."""
    digest = hashlib.sha256()
    _feed(digest, {k: v for k, v in state.items() if k != DIGEST_KEY})
    return digest.hexdigest()


def _feed(digest: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        if tensor.is_quantized:  # its integers, and the scales and zero points that give them
            _feed(digest, _quantization_parameters(tensor))
            tensor = tensor.int_repr()
        tensor = tensor.contiguous().reshape(-1)
        digest.update(f"T{tensor.dtype}{tuple(value.shape)}:".encode())
        if tensor.numel():
            digest.update(tensor.view(torch.uint8).numpy().tobytes())
    elif isinstance(value, Mapping):
        digest.update(f"M{len(value)}:".encode())
        for key, item in value.items():
            digest.update(f"{key!r}=".encode())
            _feed(digest, item)
    elif isinstance(value, list | tuple):
        digest.update(f"L{len(value)}:".encode())
        for item in value:
            _feed(digest, item)
    elif isinstance(value, torch.ScriptObject):  # its repr is its address: no digest of it
        raise TypeError(f"a checkpoint cannot hold {value!r}: save its tensors instead")
    else:
        digest.update(f"V{value!r};".encode())


def _quantization_parameters(tensor: torch.Tensor) -> dict[str, Any]:
    scheme = tensor.qscheme()
    if scheme in (torch.per_channel_affine, torch.per_channel_symmetric):
        return {
            "qscheme": str(scheme),
            "scales": tensor.q_per_channel_scales(),
            "zero_points": tensor.q_per_channel_zero_points(),
            "axis": tensor.q_per_channel_axis(),
        }
    return {
        "qscheme": str(scheme),
        "scale": tensor.q_scale(),
        "zero_point": tensor.q_zero_point(),
    }


def save_checkpoint(path: Path, state: dict[str, Any], keep_previous: bool = False) -> None:
    """Write `path` atomically (see module docstring); `keep_previous` keeps the old file as
    `<stem>.prev.pt` until the new one is whole. A full or read-only disk is a StorageError
    naming the path, with the previous checkpoint intact and no temporary file left."""
    payload = {"format": FORMAT_VERSION, **state}
    payload[DIGEST_KEY] = content_digest(payload)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path, durable=True) as handle:
            torch.save(payload, handle)
            if keep_previous and path.exists():
                _keep_previous(path)
    except OSError as error:
        raise StorageError.from_os(path, error, "cannot write the checkpoint") from error
    except RuntimeError as error:
        # torch's zip writer reports a write the disk refused (full) as its own error.
        if not any(sign in str(error) for sign in ("unexpected pos", "PytorchStreamWriter")):
            raise
        free = shutil.disk_usage(path.parent).free
        raise StorageError.at(
            "",
            f"'{path}'",
            f"cannot write the checkpoint: torch's writer stopped, with {free} bytes free on "
            f"that disk (the disk is full?): {str(error).splitlines()[0]}",
            "free some space (the previous checkpoint is intact), then resume",
        ) from error


def _keep_previous(path: Path) -> None:
    """Link the current file as `<stem>.prev.pt` before the new one is renamed over it."""
    previous = previous_path(path)
    staged = previous.with_name(f".{previous.name}.{os.getpid()}.link")
    staged.unlink(missing_ok=True)
    try:
        os.link(path, staged)
        os.replace(staged, previous)
    except OSError:  # no hard links on this file system: a copy does the same, slower
        staged.unlink(missing_ok=True)
        staged.write_bytes(path.read_bytes())
        os.replace(staged, previous)
    sync_folder(path.parent)


def previous_path(path: Path) -> Path:
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def load_checkpoint(path: Path, whole: bool = True) -> dict[str, Any]:
    """A checkpoint, checked: readable, torchloom's, and with the digest it was saved with.
    A sharded one's shard files are checked against their digests too, and its `components`
    are read from the shards (engine/sharded.py): whole weights, or with `whole=False` meta
    tensors giving only their shapes (resume reads the shards itself, each process its own)."""
    if path.is_dir():
        raise DataError.at(
            "", f"checkpoint '{path}'", "is a folder", "name a .pt file in it, e.g. best.pt"
        )
    if not path.is_file():
        raise DataError.at(
            "",
            f"checkpoint '{path}'",
            "does not exist",
            "was the run saved? `ls` its checkpoints/ folder",
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated or foreign file: a plain message, not a traceback
        raise DataError.at(
            "", f"checkpoint '{path}'", f"cannot be read: {_first_reason(error)}"
        ) from error
    if not isinstance(state, dict) or state.get("format") not in READABLE_FORMATS:
        keys = ", ".join(sorted(str(k) for k in state)[:8]) if isinstance(state, dict) else ""
        raise DataError.at(
            "",
            f"checkpoint '{path}'",
            f"is not a torchloom checkpoint (format {FORMAT_VERSION})"
            + (f"; its top-level keys: {keys}" if keys else ""),
            "`load:` reads weights from other files into one component",
        )
    # Format 1 predates digests; from format 2 on every checkpoint is saved with one, so a
    # missing digest means the file was changed after saving, as a wrong one does.
    if state["format"] >= 2 and DIGEST_KEY not in state:
        damage = "it has no SHA-256 digest, which every checkpoint of its format is saved with"
    elif DIGEST_KEY in state and content_digest(state) != state[DIGEST_KEY]:
        damage = (
            "its content does not match the SHA-256 digest it was saved with (a disk or copy "
            "error changed it)"
        )
    else:
        damage = ""
    if damage:
        raise DataError.at(
            "",
            f"checkpoint '{path}'",
            f"is damaged: {damage}",
            f"resume falls back to {previous_path(path).name} when it exists",
        )
    record = state.get(sharded.RECORD)
    if record is not None:
        problem = sharded.damage(path.parent, record)
        if problem is not None:
            raise DataError.at(
                "",
                f"checkpoint '{path}'",
                f"is damaged: {problem}",
                f"resume falls back to {previous_path(path).name} when it exists",
            )
        read = sharded.whole_components if whole else sharded.shape_components
        state["components"] = read(path.parent, record)
    return state


def _first_reason(error: Exception) -> str:
    """What is wrong, in one line, without torch's advice to load with `weights_only=False`
    (which would run whatever code the file names: torchloom never does)."""
    text = str(error)
    refused = re.search(r"WeightsUnpickler error: (.*?\.)(?:\s|$)", text)
    if refused:
        return (
            f"it holds more than tensors and plain values ({refused.group(1)}); torchloom "
            "never unpickles code"
        )
    for line in text.splitlines():
        line = line.strip()
        if line and "weights_only" not in line.lower() and "weights only" not in line.lower():
            return line
    return type(error).__name__


def load_resume_checkpoint(
    folder: Path, set_aside: bool = True
) -> tuple[dict[str, Any], str | None]:
    """`last.pt` of a run folder's checkpoints, or `last.prev.pt` when `last.pt` is missing
    or damaged; also a note saying so (for the run's log), else None. A sharded checkpoint's
    `components` are meta tensors (see load_checkpoint). A damaged `last.pt` is then set
    aside (`set_aside`: the process that writes the folder), as `last.damaged.pt`: the next
    save would otherwise keep it as `last.prev.pt`, over the one good checkpoint."""
    last = folder / "last.pt"
    try:
        return load_checkpoint(last, whole=False), None
    except DataError as error:
        previous = previous_path(last)
        if not previous.is_file():
            raise
        state = load_checkpoint(previous, whole=False)
        note = (
            f"{error.problems[0].format()}; resuming from {previous.name} instead "
            f"(episode {state['progress']['episode']})"
        )
        if set_aside and last.exists():
            os.replace(last, last.with_name("last.damaged.pt"))
            note += "; the damaged file is kept as last.damaged.pt"
        return state, note


# ---- seeds and random-generator states ------------------------------------------------------
def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def worker_init(worker_id: int) -> None:
    """Seed python and numpy in a loader worker from torch's per-worker seed (which torch
    derives from the loader's own generator), so augmentations are reproducible; leave stop
    signals to the main process."""
    # A stop signal sent to the whole process group (Ctrl-C, Slurm's scancel, systemd) is
    # the main process's to handle: torch's workers die of a SIGTERM not sent by their
    # parent, which failed a run asked to stop gracefully. The main process stops them (a
    # sentinel); they leave with it (torch's watchdog; the parent-death signal).
    for signum in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if signum is not None:
            signal.signal(signum, signal.SIG_IGN)
    set_parent_death_signal(signal.SIGKILL)
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


# The two cuBLAS workspace settings whose matrix products are reproducible on a GPU: torch
# refuses a deterministic one on CUDA unless CUBLAS_WORKSPACE_CONFIG names one of them.
DETERMINISTIC_CUBLAS_WORKSPACES = (":4096:8", ":16:8")


def reproducible_cublas_workspace() -> str:
    """CUBLAS_WORKSPACE_CONFIG, set to :4096:8 when the environment does not set it. cuBLAS
    reads it once, when the process makes its first matrix product on a GPU: a run's set-up
    comes before that, and a process that runs many trainings (a search worker) calls this
    before its first, in case a later one is deterministic."""
    return os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", DETERMINISTIC_CUBLAS_WORKSPACES[0])


def set_deterministic(enabled: bool) -> None:
    """`training.deterministic`: deterministic algorithms only, cuDNN's included, and on a GPU
    the cuBLAS workspace they need (`reproducible_cublas_workspace`)."""
    if enabled:
        workspace = reproducible_cublas_workspace()
        if workspace not in DETERMINISTIC_CUBLAS_WORKSPACES and torch.cuda.is_available():
            raise ConfigError.at(
                "environment",
                "training.deterministic",
                "needs CUBLAS_WORKSPACE_CONFIG to be :4096:8 or :16:8 for reproducible matrix "
                f"products on a GPU, and the environment sets it to {workspace!r}",
                "unset it (torchloom then sets :4096:8) or set it to :4096:8",
            )
    # torch's call imports torch._inductor for the compiler's own flag: 2 s of a small run's 7
    # on two cores. Left off, as torch starts, there is nothing to turn off.
    inductor = sys.modules.get("torch._inductor.config")
    if (
        enabled
        or torch.are_deterministic_algorithms_enabled()
        or getattr(inductor, "deterministic", False)
    ):
        torch.use_deterministic_algorithms(enabled, warn_only=False)
    torch.backends.cudnn.benchmark = not enabled
    torch.backends.cudnn.deterministic = enabled


def capture_rng_state(device: torch.device | None = None) -> dict[str, Any]:
    """Every generator of this process; `device`, the run's, names the GPU whose generator a
    resume on another GPU continues."""
    name, keys, position, has_gauss, cached = np.random.get_state(legacy=True)
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [
            name,
            torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            int(position),
            int(has_gauss),
            float(cached),
        ],
        "torch": torch.get_rng_state(),
    }
    # A process that never used CUDA has no GPU generator to keep, and asking would start
    # CUDA in it (a CPU run on a GPU machine): memory taken, and a busy GPU failing the save.
    if torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
        if device is not None and device.type == "cuda":
            state["cuda_device"] = _gpu_index(device)
    return state


def _gpu_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def restore_rng_state(state: dict[str, Any], device: torch.device | None = None) -> None:
    """The generators `capture_rng_state` kept; the run's GPU (`device`) continues the one
    of the GPU the run was saved on (`--device cuda:1` resumed on a one-GPU machine)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        # A run saved on a machine with more GPUs resumes on the GPUs this one has (torch's
        # set_rng_state_all would fail on the first GPU missing here).
        for index, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, index)
        saved = state.get("cuda_device")
        if device is not None and device.type == "cuda" and saved is not None:
            torch.cuda.set_rng_state(state["cuda"][saved], _gpu_index(device))
