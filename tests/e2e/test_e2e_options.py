"""Training options end to end: precision, accumulation, clipping, schedulers, deterministic
mode, histograms, several weighted losses, devices. CUDA checks skip where there is none."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from e2e_helpers import small_config, weights

import torchloom
from torchloom.core.pipeline import Pipeline
from torchloom.errors import LoomError


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_bf16_accumulation_clipping_and_a_per_step_scheduler(
    tmp_path: Path, mnist_folder: Path
) -> None:
    config = small_config(tmp_path, mnist_folder)
    result = torchloom.train(
        config,
        [
            "+training.precision=bf16",
            "+training.gradient_accumulation=2",
            "+training.gradient_clipping={norm: 1.0}",
            "~training.scheduler",  # replace the shipped cosine schedule
            "+training.scheduler={type: StepLR, step_size: 16, gamma: 0.5, interval: step}",
            "+training.deterministic=true",
        ],
        expdir=str(tmp_path / "runs"),
    )
    assert result.status == "epoch_limit"
    rows = _rows(result.run_dir / "training_epoch_statistics.csv")
    # 32 batches an epoch, 2 per optimizer step: 16 steps, so the rate halves once an epoch.
    assert [float(r["lr"]) for r in rows] == [5.0e-4, 2.5e-4]
    assert result.statistics["validation"]["accuracy"] > 0.3


def test_a_warm_up_written_in_the_config(tmp_path: Path, mnist_folder: Path) -> None:
    warm_up = (
        "{type: SequentialLR, milestones: [2], schedulers: [{type: LinearLR, start_factor: 0.25,"
        " total_iters: 2}, {type: CosineAnnealingLR, T_max: 2}]}"
    )
    result = torchloom.train(
        small_config(tmp_path, mnist_folder),
        [
            "training.terminal_conditions.epoch_limit=4",
            "training.optimizer.lr=0.002",
            "~training.scheduler",
            f"+training.scheduler={warm_up}",
        ],
        expdir=str(tmp_path / "runs"),
    )
    rows = _rows(result.run_dir / "training_epoch_statistics.csv")
    # The rate of each epoch, as torch's own SequentialLR gives it when stepped per epoch.
    plain = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.002)
    reference = torch.optim.lr_scheduler.SequentialLR(
        plain,
        [
            torch.optim.lr_scheduler.LinearLR(plain, start_factor=0.25, total_iters=2),
            torch.optim.lr_scheduler.CosineAnnealingLR(plain, T_max=2),
        ],
        milestones=[2],
    )
    expected = []
    for _ in range(4):
        expected.append(reference.get_last_lr()[0])
        plain.step()
        reference.step()
    assert [float(r["lr"]) for r in rows] == pytest.approx(expected, rel=1e-6)
    assert expected[0] == pytest.approx(0.0005) and max(expected) == pytest.approx(0.002)


def test_compiled_models_train_and_save_eager_checkpoints(
    tmp_path: Path, mnist_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marks: list[int] = []  # no CUDA graphs under `compile: true`, so no step begins marked
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    result = torchloom.train(
        small_config(tmp_path, mnist_folder),
        ["training.terminal_conditions.epoch_limit=1", "+training.compile=true"],
        expdir=str(tmp_path / "runs"),
    )
    assert result.statistics["validation"]["accuracy"] > 0.5
    log = (result.run_dir / "run.log").read_text(encoding="utf-8")
    assert "torch.compile (defaults): image_classifier" in log and marks == []
    # The checkpoint is the eager model's: an eager pass over the test set with best.pt gives
    # the run's own test figure.
    processed = torchloom.process(result.run_dir, expdir=str(tmp_path / "processed"))
    assert processed.statistics["accuracy"] == pytest.approx(
        result.statistics["test"]["accuracy"], abs=1e-6
    )


# Not into CUDA graphs: dynamo's eager backend, where `true` (Inductor, which the test above
# trains) took 25 s of CPU here to generate and build the same decision's C++ kernels.
@pytest.mark.parametrize(
    ("compile_setting", "marked"), [("{backend: cudagraphs}", True), ("{backend: eager}", False)]
)
def test_models_compiled_into_cuda_graphs_begin_a_step_at_each_forward(
    tmp_path: Path,
    mnist_folder: Path,
    monkeypatch: pytest.MonkeyPatch,
    compile_setting: str,
    marked: bool,
) -> None:
    """A pipeline of two compiled models (encoder, classifier) under CUDA graphs: torch takes
    every compiled call in inference as a new step, so an evaluation pass on a GPU failed at
    the classifier ("accessing tensor output of CUDAGraphs that has been overwritten", the
    encoder's output) unless each forward marks its step's start. Counted here on the CPU
    (where the graphs are skipped): one mark a forward, training's and evaluation's alike."""
    marks: list[int] = []
    forwards: list[int] = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    forward = Pipeline.forward

    def counted(self: Pipeline, batch: dict[str, object]) -> dict[str, object]:
        forwards.append(1)
        return forward(self, batch)

    monkeypatch.setattr(Pipeline, "forward", counted)
    result = torchloom.train(
        small_config(tmp_path, mnist_folder, base="loom://mnist/convnet.yml"),
        ["training.terminal_conditions.epoch_limit=1", f"+training.compile={compile_setting}"],
        expdir=str(tmp_path / "runs"),
    )
    assert result.status == "epoch_limit"
    # 32 training batches and the validation and test passes' batches.
    assert len(forwards) > 32
    assert len(marks) == (len(forwards) if marked else 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_two_models_compiled_into_cuda_graphs_train_and_evaluate_on_a_gpu(
    tmp_path: Path, mnist_folder: Path
) -> None:
    """The failure above, on the GPU it happened on: reduce-overhead, an encoder feeding a
    classifier, through training, validation and the test pass."""
    result = torchloom.train(
        small_config(tmp_path, mnist_folder, base="loom://mnist/convnet.yml"),
        ["training.terminal_conditions.epoch_limit=1", "+training.compile={mode: reduce-overhead}"],
        device="cuda",
        expdir=str(tmp_path / "runs"),
    )
    assert result.status == "epoch_limit"
    assert result.statistics["validation"]["accuracy"] > 0.3
    assert result.statistics["test"]["samples"] == 256


def test_histograms_and_two_weighted_losses(tmp_path: Path, mnist_folder: Path) -> None:
    config = small_config(tmp_path, mnist_folder, base="loom://mnist/2lenet5_2losses.yml")
    result = torchloom.train(
        config,
        ["training.terminal_conditions.epoch_limit=1", "training.logging_interval=10"],
        expdir=str(tmp_path / "runs"),
        tensorboard=2,
    )
    validation = result.statistics["validation"]
    # One backward pass over loss_a + 0.5 * loss_b; each loss reported on its own too.
    assert validation["loss"] == pytest.approx(validation["loss_a"] + 0.5 * validation["loss_b"])
    assert {"accuracy_a.accuracy", "accuracy_b.accuracy"} <= validation.keys()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(result.run_dir / "tensorboard"), size_guidance={"histograms": 0})
    events.Reload()
    histograms = events.Tags()["histograms"]
    assert any(t.startswith("weights/lenet_a/") for t in histograms)
    assert any(t.startswith("gradients/lenet_b/") for t in histograms)
    assert "training/loss" in events.Tags()["scalars"]


def test_asking_for_cuda_without_it_is_a_clear_error(tmp_path: Path, mnist_folder: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the error path cannot be shown here")
    with pytest.raises(LoomError, match="CUDA is not available"):
        torchloom.train(
            small_config(tmp_path, mnist_folder), device="cuda", expdir=str(tmp_path / "runs")
        )
    assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_cuda_training_with_mixed_precision(
    tmp_path: Path, mnist_folder: Path, precision: str
) -> None:
    result = torchloom.train(
        small_config(tmp_path, mnist_folder),
        [f"+training.precision={precision}", "+training.dataloader.pin_memory=true"],
        device="cuda",
        expdir=str(tmp_path / "runs"),
    )
    assert result.summary["device"].startswith("cuda")
    assert result.statistics["validation"]["accuracy"] > 0.5


ON_DEVICE = [
    f"++{section}.dataloader.on_device=true" for section in ("training", "validation", "test")
]


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
        ),
    ],
)
def test_batches_gathered_on_the_device_train_as_batches_from_the_host(
    tmp_path: Path, mnist_folder: Path, device: str
) -> None:
    """`dataloader.on_device` in every section gives each pass the host loader's batches, built
    on the run's device: the run is the same to the bit as one from the host, on a GPU too in
    deterministic mode (which must work there: cuBLAS's workspace, cuDNN's algorithms)."""
    config = small_config(tmp_path, mnist_folder)
    overrides = ["+training.deterministic=true"] if device == "cuda" else []
    held = torchloom.train(
        config, [*overrides, *ON_DEVICE], device=device, expdir=str(tmp_path / "held")
    )
    assert held.status == "epoch_limit" and held.summary["device"].startswith(device)
    assert held.statistics["validation"]["accuracy"] > 0.5
    plain = torchloom.train(config, overrides, device=device, expdir=str(tmp_path / "plain"))
    assert held.statistics == plain.statistics
    held_weights = weights(held.run_dir)
    for component, tensors in weights(plain.run_dir).items():
        for name, tensor in tensors.items():
            assert torch.equal(held_weights[component][name], tensor), (component, name)


def test_precision_recall_statistics_can_be_monitored(tmp_path: Path, mnist_folder: Path) -> None:
    result = torchloom.train(
        small_config(tmp_path, mnist_folder),
        [
            "+pipeline.scores.type=PrecisionRecallStatistics",
            "training.terminal_conditions.early_stopping.monitor=validation.f1_macro",
        ],
        expdir=str(tmp_path / "runs"),
    )
    validation = result.statistics["validation"]
    assert 0 < validation["f1_macro"] <= 1 and validation["f1_micro"] == pytest.approx(
        validation["accuracy"], abs=1e-6
    )  # single-label: micro F1 is the accuracy
    assert result.summary["monitor"]["name"] == "validation.f1_macro"


def test_loss_stop_threshold_converges(tmp_path: Path, mnist_folder: Path) -> None:
    result = torchloom.train(
        small_config(tmp_path, mnist_folder),
        [
            "training.terminal_conditions.epoch_limit=5",
            "+training.terminal_conditions.loss_stop_threshold=100.0",  # met after the first epoch
        ],
        expdir=str(tmp_path / "runs"),
    )
    assert result.status == "converged" and result.summary["epochs"] == 1


def test_process_exports_streams_per_sample(tmp_path: Path, mnist_folder: Path) -> None:
    run = torchloom.train(
        small_config(tmp_path, mnist_folder),
        ["training.terminal_conditions.epoch_limit=1"],
        expdir=str(tmp_path / "runs"),
    )
    processed = torchloom.process(
        run.run_dir,
        [
            "+pipeline.decision={type: ArgMaxPrediction, labels: true}",
            "+pipeline.export={type: StreamFileExporter, input_streams: [indices, predicted_labels,"
            " targets], filename: answers.csv}",
        ],
        section="test",
    )
    rows = _rows(processed.folder / "answers.csv")
    assert len(rows) == 256 and list(rows[0]) == ["indices", "predicted_labels", "targets"]
    correct = sum(r["predicted_labels"] == r["targets"] for r in rows) / len(rows)
    assert correct == pytest.approx(processed.statistics["accuracy"], abs=1e-6)


def test_stream_viewer_lines_reach_the_run_log(tmp_path: Path, mnist_folder: Path) -> None:
    result = torchloom.train(
        small_config(tmp_path, mnist_folder),
        [
            "training.terminal_conditions.epoch_limit=1",
            "+pipeline.viewer={type: StreamViewer, input_streams: [targets, labels], interval: 10}",
        ],
        expdir=str(tmp_path / "runs"),
    )
    log = (result.run_dir / "run.log").read_text()
    assert "targets" in log and "labels" in log
