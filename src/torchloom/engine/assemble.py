"""From a config file to a checked pipeline: the first step of every worker.

load (nesting, overrides, interpolation) -> section schemas -> build components -> handshake.
Each step collects all of its problems and raises one error; nothing is written anywhere, so
a rejected config leaves no trace. Workers that seed before building call the two halves.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from torchloom.config import LoadedConfig, load_config
from torchloom.config.schema import validate_sections
from torchloom.core.handshake import handshake
from torchloom.core.pipeline import Pipeline
from torchloom.core.pipeline_builder import build_pipeline


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
    path: str | os.PathLike[str], overrides: Sequence[str] = ()
) -> tuple[LoadedConfig, dict[str, BaseModel]]:
    loaded = load_config(path, overrides)
    if "name" not in loaded.data:
        # Record the name now, so a run's saved config.yaml keeps the pipeline's name.
        loaded.data = {"name": Path(loaded.path).stem, **loaded.data}
    return loaded, validate_sections(loaded.data, loaded.where)


def build_checked(loaded: LoadedConfig, disable: Sequence[str] = ()) -> Pipeline:
    pipeline = build_pipeline(loaded.data, loaded.where, disable)
    handshake(pipeline, loaded.where)
    return pipeline


def assemble(
    path: str | os.PathLike[str], overrides: Sequence[str] = (), disable: Sequence[str] = ()
) -> Assembled:
    loaded, sections = load_and_validate(path, overrides)
    return Assembled(loaded, sections, build_checked(loaded, disable))
