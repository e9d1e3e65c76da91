"""From a config file to a checked pipeline: the first step of every worker.

load (nesting, overrides, interpolation) -> section schemas -> build components -> handshake.
Each step collects all of its problems and raises one error; nothing is written anywhere, so
a rejected config leaves no trace.
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
        """The pipeline's name: `name:` from the config, else the config file's stem."""
        name = self.config.data.get("name")
        return name if isinstance(name, str) and name else Path(self.config.path).stem


def assemble(path: str | os.PathLike[str], overrides: Sequence[str] = (),
             disable: Sequence[str] = ()) -> Assembled:
    loaded = load_config(path, overrides)
    sections = validate_sections(loaded.data, loaded.where)
    pipeline = build_pipeline(loaded.data, loaded.where, disable)
    handshake(pipeline, loaded.where)
    return Assembled(loaded, sections, pipeline)
