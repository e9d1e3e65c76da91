"""The bi-level search as a training mode: a short search on a few MNIST images (the packaged
copy; Debian's Fashion-MNIST is not installed on every machine) runs, moves the architecture
parameters, writes genotype.yml, the alphas per epoch and a
derived.yml that `loom check` accepts and `loom train` trains; a search killed with SIGKILL
and resumed ends bit-identical to one that ran through."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

import torchloom
from torchloom.analysis.plotting import png_data
from torchloom.cli.main import main
from torchloom.engine.checkpoint import load_checkpoint
from toy_runs import only_run, summary, train


def search_config(folder: Path, order: str = "first", epochs: int = 2, size: int = 64) -> Path:
    data = folder / "mnist"
    text = f"""\
name: darts_tiny
training:
  task: {{type: MNIST, split: train, data_folder: {data}, subset: {size},
          transforms: {{resize: [16, 16]}}}}
  dataloader: {{batch_size: 16}}
  optimizer: {{type: SGD, lr: 0.025, momentum: 0.9, weight_decay: 3.0e-4}}
  seed: 5
  logging_interval: 2
  terminal_conditions: {{epoch_limit: {epochs}}}
  architecture_search: {{order: {order}, split: 0.5, derived: {{channels: 6}}}}
validation:
  task: {{type: MNIST, split: validation, data_folder: {data}, subset: 16,
          transforms: {{resize: [16, 16]}}}}
pipeline:
  image_classifier:
    type: DartsNetwork
    cells: 3
    channels: 4
    steps: 2
    multiplier: 2
    globals: {{prediction_size: num_classes}}
  loss: {{type: CrossEntropyLoss}}
  accuracy: {{type: AccuracyStatistics}}
"""
    path = folder / "search.yml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("order", ["first", "second"])
def test_search_writes_genotype_and_a_trainable_derived_config(tmp_path: Path, order: str) -> None:
    config = search_config(tmp_path, order)
    # Through the command, so that the run's analysis draws the heat maps.
    assert main(["train", str(config), "--expdir", str(tmp_path / "runs"), "--quiet"]) == 0
    run = only_run(tmp_path / "runs")
    assert summary(run)["status"] == "epoch_limit", summary(run)
    checkpoint = load_checkpoint(run / "checkpoints" / "last.pt")
    alphas = checkpoint["components"]["image_classifier"]["alpha_normal"]
    assert float(alphas.abs().sum()) > 0  # the architecture moved from its zeros
    assert checkpoint["architecture_search"]["optimizer"]["state"]  # Adam's moments saved
    history = json.loads((run / "architecture" / "alphas.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2]
    softmax = history[-1]["components"]["image_classifier"]["softmax"]["normal"]
    assert len(softmax) == 5 and all(abs(sum(row) - 1) < 1e-5 for row in softmax)
    genotype = yaml.safe_load((run / "genotype.yml").read_text())
    assert len(genotype["normal"]) == 4 and genotype["normal_concat"] == [2, 3]
    derived = yaml.safe_load((run / "derived.yml").read_text())
    assert "architecture_search" not in derived["training"]
    entry = derived["pipeline"]["image_classifier"]
    assert entry["type"] == "DartsFixedNetwork" and entry["channels"] == 6
    assert entry["genotype"] == genotype
    assert main(["check", str(run / "derived.yml")]) == 0
    heat_map = png_data(run / "reports" / "architecture" / "image_classifier-alphas.png")
    assert heat_map["epoch"] == 2 and heat_map["normal"] == softmax
    assert len(heat_map["operations"]) == 8 and heat_map["edges"][0] == "2<-0"
    if order == "first":
        trained = train(
            run / "derived.yml",
            tmp_path / "derived_runs",
            overrides=["training.terminal_conditions.epoch_limit=1"],
        )
        assert trained.summary["status"] == "epoch_limit"


def _episode(expdir: Path) -> int:
    for log in expdir.glob("*/*/training_statistics.csv"):
        rows = log.read_text().strip().splitlines()
        if len(rows) > 1 and rows[-1].count(",") == rows[0].count(","):
            return int(rows[-1].split(",")[0])
    return 0


@pytest.mark.slow
def test_search_killed_and_resumed_is_bit_identical(
    tmp_path: Path, entry_points_folder: Path | None
) -> None:
    config = search_config(tmp_path, "second", epochs=3, size=96)
    train(config, tmp_path / "reference")
    reference = load_checkpoint(only_run(tmp_path / "reference") / "checkpoints" / "last.pt")

    src = Path(__file__).resolve().parents[2] / "src"
    paths = [str(src), *([str(entry_points_folder)] if entry_points_folder else [])]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    expdir = tmp_path / "killed"
    loom = [sys.executable, "-m", "torchloom.cli.main"]
    command = [*loom, "train", str(config), "--expdir", str(expdir), "--quiet"]
    process = subprocess.Popen(
        [*command, "+training.checkpoint_interval=1"], env=env, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while _episode(expdir) < 4:  # in the second of three epochs (3 batches each)
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        assert time.monotonic() < deadline, "the search made no progress"
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=60) == -signal.SIGKILL
    run = only_run(expdir)
    assert load_checkpoint(run / "checkpoints" / "last.pt")["progress"]["episode"] < 9
    torchloom.train(resume=run)  # `loom train --resume`, in this process
    final = load_checkpoint(run / "checkpoints" / "last.pt")
    for name, tensor in reference["components"]["image_classifier"].items():
        assert torch.equal(tensor, final["components"]["image_classifier"][name]), name
    ours, theirs = final["architecture_search"], reference["architecture_search"]
    assert ours["history"] == theirs["history"]  # the alphas' softmax after every epoch
    assert ours["passes"] == theirs["passes"] and ours["position"] == theirs["position"]
    for key, state in theirs["optimizer"]["state"].items():
        for field, value in state.items():
            assert torch.equal(
                torch.as_tensor(value), torch.as_tensor(ours["optimizer"]["state"][key][field])
            )


def test_bf16_and_a_second_order_search_are_refused_by_loom_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The second-order gradient's finite difference moves each weight by about 1e-5,
    which bf16 (8 significant bits) rounds away: a number that would be mostly noise."""
    config = str(search_config(tmp_path, order="second"))
    assert main(["check", config, "+training.precision=bf16"]) == 2
    error = capsys.readouterr().err
    assert "training.precision" in error and "order: second" in error
    assert "use order: first" in error
    config = str(search_config(tmp_path, order="first"))
    assert main(["check", config, "+training.precision=bf16"]) == 0


def test_gradient_accumulation_with_an_architecture_search_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One architecture step goes before each weight step; with gradient_accumulation it ran
    before every batch, k architecture steps for one weight step."""
    config = str(search_config(tmp_path, order="first"))
    assert main(["check", config, "+training.gradient_accumulation=2"]) == 2
    error = capsys.readouterr().err
    assert "training.gradient_accumulation" in error and "before each weight step" in error


def test_a_second_order_step_computes_in_full_float32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Ampere and later GPUs cuDNN convolutions use TF32 by default, whose 10-bit mantissa
    rounded two thirds of the finite difference's shifted weights (about 1e-5 apart) to the
    same value: the hypergradient was mostly rounding. The step now runs with TF32 off, and
    the user's settings are back afterwards."""
    import torchloom.engine.architecture_search as search

    seen: list[tuple[str, str]] = []
    original = search.second_order_gradient

    def recorded(*args: object, **kwargs: object) -> list[torch.Tensor]:
        seen.append(
            (torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision)
        )
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(search, "second_order_gradient", recorded)
    before = (torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision)
    train(search_config(tmp_path, order="second", epochs=1, size=32), tmp_path / "runs")
    assert seen and set(seen) == {("ieee", "ieee")}
    after = (torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision)
    assert after == before
