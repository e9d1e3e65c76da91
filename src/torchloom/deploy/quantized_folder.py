"""Reading a result folder of `loom quantize` (`RUN_DIR/quantized/<mode>/`, written by
quantize.py): whether a folder is one, the quantized engine its int8 weights are packed for,
and its pipeline rebuilt with the saved int8 state. Every way such a folder can be damaged,
or overridden out of shape, is a DeployError naming the file and the component (exit 2)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from torchloom.core.pipeline import Pipeline
from torchloom.data.json_files import UnreadableJson, read_json
from torchloom.deploy.eager_dynamic import load_savable_state, savable_state
from torchloom.deploy.quantizer import (
    Plan,
    QuantizeOptions,
    accepted_deprecations,
    choose_quantizer,
    quantized_engine,
)
from torchloom.engine.checkpoint import DIGEST_KEY, content_digest
from torchloom.errors import DeployError

FORMAT = "torchloom-quantized"


def is_quantized_folder(folder: str | Path) -> bool:
    """Whether `folder` is a result folder of `loom quantize`."""
    folder = Path(folder).expanduser()
    return (folder / "model.pt").is_file() and (folder / "quantization_report.json").is_file()


def quantized_backend(folder: str | Path) -> str:
    """The quantized engine a `loom quantize` result runs on (its int8 weights are packed for
    it): what `quantized_engine(...)` must be set to around every call."""
    path = Path(folder).expanduser() / "quantization_report.json"
    try:
        report = read_json(path)
    except UnreadableJson as error:
        raise DeployError.at("", f"'{path}'", str(error), _AGAIN) from error
    options = report.get("options") if isinstance(report, dict) else None
    backend = options.get("backend") if isinstance(options, dict) else None
    if not isinstance(backend, str):
        raise DeployError.at(
            "",
            f"'{path}'",
            "is damaged: it has no options.backend (the engine the int8 weights are packed for)",
            _AGAIN,
        )
    return backend


def load_quantized(folder: str | Path, overrides: Sequence[str] = ()) -> Pipeline:
    """The pipeline of a `loom quantize` result folder, int8 models included, in eval mode:
    rebuilt from its config.yaml, its models prepared and converted as when they were
    quantized, then given the saved state (read with `weights_only=True`). `overrides` as
    for `loom process` (a test subset, say); the models' structure must stay as saved."""
    from torchloom.config import load_config
    from torchloom.engine.assemble import build_checked

    folder = Path(folder).expanduser()
    path = folder / "model.pt"
    if not path.is_file() or not (folder / "config.yaml").is_file():
        raise DeployError.at(
            "",
            f"'{folder}'",
            "is not a folder of `loom quantize` (it needs model.pt and config.yaml)",
        )
    try:
        with accepted_deprecations():
            saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise DeployError.at("", f"'{path}'", f"cannot be read: {error}") from error
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        raise DeployError.at("", f"'{path}'", f"is not a {FORMAT} file")
    if DIGEST_KEY not in saved:
        raise DeployError.at(
            "",
            f"'{path}'",
            "has no SHA-256 digest of its content (written before torchloom saved one), "
            "so damaged int8 weights could not be told from good ones",
            _AGAIN,
        )
    if content_digest(saved) != saved[DIGEST_KEY]:
        raise DeployError.at(
            "",
            f"'{path}'",
            "is damaged: its content does not match the SHA-256 digest it was saved with "
            "(a disk or copy error changed it)",
            _AGAIN,
        )
    options = _saved_options(saved, path)
    quantizer = choose_quantizer(options)
    loaded = load_config(folder / "config.yaml", overrides)
    pipeline = build_checked(loaded)
    components = saved.get("components")
    if not isinstance(components, dict):
        raise DeployError.at("", f"'{path}'", "has no components' weights", _AGAIN)
    _check_components(pipeline, components, path)
    with quantized_engine(options.backend), accepted_deprecations():
        for model in pipeline.models:
            quantizer.prepare(model, Plan())
            quantizer.convert(model)
        for name, component in pipeline.components.items():
            _check_layout(name, savable_state(component), components.get(name, {}), path)
            try:
                load_savable_state(component, components.get(name, {}))
            except RuntimeError as error:  # missing, unexpected or reshaped weights
                raise DeployError.at(
                    "",
                    f"'{path}'",
                    f"does not fit component '{name}' as the config builds it now: "
                    f"{str(error).splitlines()[0][:300]}",
                    _SAME_STRUCTURE,
                ) from error
    pipeline.eval()
    return pipeline


_AGAIN = "quantize the run again: loom quantize RUN_DIR --mode MODE --force"
_SAME_STRUCTURE = (
    "overrides of a quantized folder may change data and statistics, not the components "
    "with weights (their names, types or sizes)"
)


def _saved_options(saved: dict[str, Any], path: Path) -> QuantizeOptions:
    record = saved.get("options")
    try:
        if not isinstance(record, dict):
            raise TypeError("not a mapping")
        return QuantizeOptions(**{**record, "skip": tuple(record["skip"])})
    except (KeyError, TypeError) as error:
        raise DeployError.at(
            "", f"'{path}'", f"has no readable quantization options ({error})", _AGAIN
        ) from error


def _check_components(pipeline: Pipeline, components: dict[str, Any], path: Path) -> None:
    """Every component with weights has saved weights, and every saved weight a component:
    an override that adds or renames a component with weights would otherwise run it
    untrained, or fail mid-load. Components without state (statistics, viewers) may come
    and go."""
    for name, component in pipeline.components.items():
        if name not in components and component.state_dict():
            raise DeployError.at(
                "",
                f"'{path}'",
                f"has no weights for component '{name}' "
                f"(it holds: {', '.join(sorted(components)) or 'none'})",
                _SAME_STRUCTURE,
            )
    for name, state in components.items():
        if name not in pipeline.components and state:
            raise DeployError.at(
                "",
                f"'{path}'",
                f"holds weights for component '{name}', which the config no longer has",
                _SAME_STRUCTURE,
            )


def _layout(value: Any) -> Any:
    """The shapes of a state dict's tensors, nested as they are (quantized layers keep packed
    (weight, bias) tuples, whose `load_state_dict` checks no shape)."""
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    if isinstance(value, Mapping):
        return {key: _layout(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_layout(item) for item in value]
    return type(value).__name__


def _check_layout(name: str, built: Mapping[str, Any], saved: Any, path: Path) -> None:
    if not isinstance(saved, Mapping):
        raise DeployError.at("", f"'{path}'", f"has no state dict for component '{name}'", _AGAIN)
    for key in sorted(set(built) | set(saved)):
        have = _layout(saved[key]) if key in saved else "nothing"
        want = _layout(built[key]) if key in built else "nothing"
        if have != want:
            raise DeployError.at(
                "",
                f"'{path}'",
                f"does not fit component '{name}' as the config builds it now: "
                f"'{key}' is {have} in the file, {want} in the component",
                _SAME_STRUCTURE,
            )
