"""Trained run folders for the deployment tests: a LeNet-5 and a feed-forward network on 768
real MNIST images (the packaged offline copy), one short epoch each, and the LeNet-5's ONNX
export, made once per test session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import torchloom
from torchloom.cli.main import main


def small_run(folder: Path, data: Path, base: str) -> Path:
    config = folder / "small.yml"
    config.write_text(
        f"""\
default_configs: [{base}]
training:
  task: {{data_folder: {data}, subset: 768}}
  dataloader: {{batch_size: 32}}
  seed: 7
  logging_interval: 8
  terminal_conditions: {{epoch_limit: 1}}
validation:
  task: {{subset: 256}}
test:
  task: {{subset: 256}}
""",
        encoding="utf-8",
    )
    result = torchloom.train(config, expdir=str(folder / "runs"), analysis=False, tensorboard=0)
    return Path(result.run_dir)


@pytest.fixture(scope="session")
def mnist_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mnist")


@pytest.fixture(scope="session")
def lenet_run(tmp_path_factory: pytest.TempPathFactory, mnist_data: Path) -> Path:
    return small_run(tmp_path_factory.mktemp("lenet"), mnist_data, "loom://mnist/lenet5.yml")


@pytest.fixture(scope="session")
def onnx_folder(lenet_run: Path) -> Path:
    """The LeNet-5 run's ONNX export (with its int8 model), made once per test session."""
    assert main(["export", str(lenet_run), "--format", "onnx", "--int8", "--repeats", "5"]) == 0
    return lenet_run / "exports" / "onnx"


@pytest.fixture
def small_trainer() -> Callable[[Path, Path, str], Path]:
    """`small_run`, for a test's own MNIST pipeline."""
    return small_run


@pytest.fixture(scope="session")
def ffn_run(tmp_path_factory: pytest.TempPathFactory, mnist_data: Path) -> Path:
    return small_run(tmp_path_factory.mktemp("ffn"), mnist_data, "loom://mnist/ffn.yml")


# The BBC News corpus (the packaged offline copy) cut small: 150 articles for one epoch.
SMALL_BBC = """\
training:
  task: {subset: 150}
  terminal_conditions: {epoch_limit: 1}
validation:
  task: {subset: 40}
test:
  task: {subset: 40}
"""


def train_small_bbc(folder: Path, base: str, pipeline: str = "") -> Path:
    """A run of the config `base` (and `pipeline`, YAML of its own components) on SMALL_BBC."""
    config = folder / "bbc.yml"
    config.write_text(f"default_configs: [{base}]\n{SMALL_BBC}{pipeline}", encoding="utf-8")
    result = torchloom.train(config, expdir=str(folder / "runs"), analysis=False, tensorboard=0)
    return Path(result.run_dir)


@pytest.fixture(scope="session")
def bbc_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The BBC News bag-of-words pipeline (a tokenizer, an indexer and an encoder before its
    model) on 150 articles for one epoch."""
    return train_small_bbc(tmp_path_factory.mktemp("bbc"), "loom://language/bbc_news_bow_ffn.yml")


@pytest.fixture
def bbc_trainer() -> Callable[[Path, str, str], Path]:
    """`train_small_bbc`, for a test's own BBC News pipeline."""
    return train_small_bbc
