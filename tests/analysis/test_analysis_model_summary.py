"""Model summary: LeNet-5's layer shapes and memory estimate on MNIST, and that measuring
them leaves a run bit-identical (same weights, same random stream)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from torchloom.analysis.classification import ClassificationAnalysis
from torchloom.analysis.learning_rate import LearningRateRecorder
from torchloom.analysis.model_summary import ModelSummary, optimizer_slots
from torchloom.analysis.schema import AnalysisConfig
from torchloom.engine.setup import prepare_training
from torchloom.engine.state import Hook, TrainOptions
from torchloom.engine.trainer import TrainingLoop


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder, data = tmp_path_factory.mktemp("summary"), tmp_path_factory.mktemp("mnist")
    path = folder / "small.yml"
    path.write_text(
        f"""\
default_configs: [loom://mnist/lenet5.yml]
training:
  task: {{data_folder: {data}, subset: 160}}
  dataloader: {{batch_size: 32}}
  seed: 11
  logging_interval: 2
  terminal_conditions: {{epoch_limit: 2}}
validation:
  task: {{subset: 64}}
test:
  task: {{subset: 64}}
pipeline:
  image_classifier: {{dropout: 0.5}}  # Dropout draws from the RNG: a shifted stream shows
""",
        encoding="utf-8",
    )
    return path


def prepared(
    config: Path, folder: Path, hooks: list[Hook], overrides: tuple[str, ...] = ()
) -> TrainingLoop:
    options = TrainOptions(expdir=str(folder), quiet=True, tensorboard=0, hooks=hooks)
    loop = prepare_training(config, overrides, options)
    assert isinstance(loop, TrainingLoop)
    return loop


def test_summary_of_lenet5_on_mnist(
    config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = ModelSummary(AnalysisConfig())
    loop = prepared(config, tmp_path, [hook])
    state = loop.view
    state.pipeline.train()
    task_class = type(state.train_data.task)
    original = task_class.__getitem__

    def augmenting(task: Any, index: int) -> Any:
        torch.rand(1)  # as a random augmentation would
        return original(task, index)

    monkeypatch.setattr(task_class, "__getitem__", augmenting)
    rng = torch.get_rng_state()
    hook.before_train(state)
    assert torch.equal(rng, torch.get_rng_state()), "the random stream is untouched"
    assert all(
        module.training for module in state.pipeline.components["image_classifier"].modules()
    )
    loop.close()
    text = (state.run_dir / "reports" / "model_summary.md").read_text()
    assert "| image_classifier | LeNet5 | 61,706 | 0 |" in text
    # conv1 keeps 28x28 (padding 2); a batch is the configured 32 samples.
    assert "| image_classifier | features.0 | Conv2d | [32, 6, 28, 28] | 156 |" in text
    assert "| image_classifier | features.3 | Conv2d | [32, 16, 10, 10] | 2,416 |" in text
    assert "| image_classifier | classifier.5 | Linear | [32, 10] | 850 |" in text
    assert "| nllloss | (itself) | NLLLoss | {loss: []} | 0 |" in text
    assert "accuracy |" not in text.split("## Layers")[1], "statistics are not run"
    assert hook.summary is not None
    memory = hook.summary.memory_mb
    weights = 61_706 * 4 / 1e6
    assert memory["parameters"] == pytest.approx(weights)
    assert memory["gradients"] == pytest.approx(weights)
    assert memory["optimizer state"] == pytest.approx(2 * weights)  # Adam: two moments
    conv1 = 32 * 6 * 28 * 28 * 4 / 1e6
    assert conv1 < memory["activations"] < 10 * conv1
    assert memory["total"] == pytest.approx(sum(v for k, v in memory.items() if k != "total"))
    log = (state.run_dir / "run.log").read_text()
    assert "model summary: image_classifier (LeNet5): 61,706 parameters" in log


def test_optimizer_slots() -> None:
    weights = [torch.nn.Parameter(torch.zeros(2))]
    assert optimizer_slots(torch.optim.SGD(weights, lr=0.1)) == 0
    assert optimizer_slots(torch.optim.SGD(weights, lr=0.1, momentum=0.9)) == 1
    assert optimizer_slots(torch.optim.AdamW(weights, amsgrad=True)) == 3
    assert optimizer_slots(torch.optim.RMSprop(weights)) == 2  # taken as Adam-like


def test_analysis_hooks_leave_training_bit_identical(config: Path, tmp_path: Path) -> None:
    # Every per-step path runs (counts, reports, error files); the slow plots are left out.
    analysis = AnalysisConfig(confusion_matrix=False, roc=False)
    hooks: list[Hook] = [
        ModelSummary(analysis),
        ClassificationAnalysis(analysis),
        LearningRateRecorder(analysis),
    ]
    runs = []
    overrides = ("training.terminal_conditions.epoch_limit=1", "~test")
    for name, run_hooks in (("without", []), ("with", hooks)):
        state = prepared(config, tmp_path / name, run_hooks, overrides)
        runs.append(state.run().run_dir)
    weights = [
        torch.load(run / "checkpoints" / "last.pt", weights_only=True)["components"] for run in runs
    ]
    for component, tensors in weights[0].items():
        for key, tensor in tensors.items():
            assert torch.equal(tensor, weights[1][component][key]), f"{component}.{key} differs"
    assert (runs[1] / "reports" / "model_summary.md").is_file()
    assert (runs[0] / "validation_epoch_statistics.csv").read_text() == (
        runs[1] / "validation_epoch_statistics.csv"
    ).read_text()
