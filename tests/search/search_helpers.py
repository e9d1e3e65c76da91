"""A LeNet-5 config on a few hundred MNIST images, for the search tests (a trial takes a
second or two)."""

from __future__ import annotations

from pathlib import Path


def tiny_config(folder: Path, data: Path, search: str = "", epochs: int = 1) -> Path:
    """LeNet-5 on 256 training images, 64 validation images, 64 test images."""
    text = f"""\
default_configs: [loom://mnist/lenet5.yml]
name: tiny
training:
  task: {{data_folder: {data}, subset: 256}}
  dataloader: {{batch_size: 32}}
  seed: 3
  logging_interval: 4
  terminal_conditions: {{epoch_limit: {epochs}}}
validation:
  task: {{subset: 64}}
test:
  task: {{subset: 64}}
{search}"""
    path = folder / "tiny.yml"
    path.write_text(text, encoding="utf-8")
    return path
