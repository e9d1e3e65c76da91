"""What every worker does first: from a config file to a checked pipeline, and a device.

load (nesting, overrides, interpolation) -> section schemas -> build components -> handshake.
Each step collects all of its problems and raises one error; nothing is written anywhere, so
a rejected config leaves no trace. Workers that seed before building call the two halves.
The device is `--device cpu|cuda|cuda:N`, cuda by default when there is one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import BaseModel

from torchloom.config import LoadedConfig, load_config
from torchloom.config.loading import ConfigSource
from torchloom.config.schema import validate_sections
from torchloom.core.handshake import handshake
from torchloom.core.pipeline import Pipeline
from torchloom.core.pipeline_builder import build_pipeline
from torchloom.errors import ConfigError


@dataclass
class Assembled:
    config: LoadedConfig
    sections: dict[str, BaseModel]
    pipeline: Pipeline

    @property
    def name(self) -> str:
        return pipeline_name(self.config)


def pipeline_name(config: LoadedConfig) -> str:
    """`name:` from the config, else the config file's stem (a run's config.yaml records it)."""
    name = config.data.get("name")
    return name if isinstance(name, str) and name else Path(config.path).stem


def load_and_validate(
    source: ConfigSource, overrides: Sequence[str] = ()
) -> tuple[LoadedConfig, dict[str, BaseModel]]:
    loaded = load_config(source, overrides)
    if "name" not in loaded.data:
        # Record the name now, so a run's saved config.yaml keeps the pipeline's name.
        loaded.data = {"name": Path(loaded.path).stem, **loaded.data}
    return loaded, validate_sections(loaded.data, loaded.where)


def build_checked(loaded: LoadedConfig, disable: Sequence[str] = ()) -> Pipeline:
    pipeline = build_pipeline(loaded.data, loaded.where, disable)
    handshake(pipeline, loaded.where)
    return pipeline


def assemble(
    source: ConfigSource, overrides: Sequence[str] = (), disable: Sequence[str] = ()
) -> Assembled:
    loaded, sections = load_and_validate(source, overrides)
    return Assembled(loaded, sections, build_checked(loaded, disable))


def resolve_device(name: str | None) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ConfigError.at(
            "command line", f"--device '{name}'", str(error), "use cpu, cuda or cuda:N"
        ) from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError.at(
            "command line",
            f"--device '{name}'",
            "CUDA is not available on this machine",
            "use --device cpu",
        )
    if (
        device.type == "cuda"
        and device.index is not None
        and (device.index >= torch.cuda.device_count())
    ):
        raise ConfigError.at(
            "command line",
            f"--device '{name}'",
            f"only {torch.cuda.device_count()} CUDA device(s) exist",
        )
    if device.type not in ("cpu", "cuda"):
        raise ConfigError.at(
            "command line",
            f"--device '{name}'",
            "unsupported device type",
            "use cpu, cuda or cuda:N",
        )
    return device
