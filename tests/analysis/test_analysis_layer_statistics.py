"""Layer statistics: activations and gradient norms per layer on measured steps only, CSV and
TensorBoard, warnings for vanishing and exploding gradients; training stays bit-identical."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
from test_analysis_worst_samples import (
    assert_bit_identical,
    baseline_weights,
    final_weights,
    train,
)
from torch import nn

from torchloom.analysis.layer_statistics import LayerStatistics, combine, find_layers
from torchloom.analysis.model_summary import ModelSummary
from torchloom.analysis.schema import AnalysisConfig, LayerStatisticsConfig
from torchloom.engine.distributed import SINGLE
from torchloom.engine.reporting import close_logger, make_logger


def rows_of(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.name = "net"
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

    @property
    def first(self) -> nn.Linear:
        return cast(nn.Linear, self.body[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def hooked(net: Net) -> bool:
    first = net.first
    return bool(first._forward_hooks) or bool(first.weight._backward_hooks)


def fake_run(folder: Path, net: Net, interval: int, scaler: Any = None) -> Any:
    """What LayerStatistics reads of a run, with `net` as the pipeline's one model."""
    return SimpleNamespace(
        progress=SimpleNamespace(episode=0, epoch=0),
        logging_interval=interval,
        run_dir=folder,
        pipeline=SimpleNamespace(models=[net], training=True),
        precision=SimpleNamespace(scaler=scaler),
        tensorboard=None,
        log=make_logger(folder, quiet=True),
        distributed=SINGLE,
        sharded_models=False,
        device=torch.device("cpu"),
    )


def test_measured_steps_match_a_direct_computation_and_warn(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = Net()
    run = fake_run(tmp_path, net, interval=10)
    pipeline, log = run.pipeline, run.log
    config = AnalysisConfig(layer_statistics=LayerStatisticsConfig(interval=2))
    hook = LayerStatistics(config)
    hook.before_train(run)
    assert hooked(net)  # the first step is measured (a run shorter than the interval too)
    # Gradients scaled tiny at the first measured step, huge at the second.
    scales = {1: 1.0, 2: 1e-12, 3: 1.0, 4: 1e9}
    expected: dict[int, dict[str, float]] = {}
    for episode in range(1, 5):
        x = torch.randn(16, 4)
        if episode == 4:  # an evaluation pass between registering and the step: not counted
            pipeline.training = False
            with torch.no_grad():
                net(torch.full((3, 4), 100.0))
            pipeline.training = True
        hidden = net.body[0](x)
        loss = scales[episode] * net.body[2](net.body[1](hidden)).sum()
        loss.backward()
        hidden = hidden.detach()
        gradients = [p.grad for p in net.first.parameters() if p.grad is not None]
        norm = math.sqrt(sum(float(g.square().sum()) for g in gradients))
        expected[episode] = {
            "activation_mean": float(hidden.mean()),
            "activation_std": float(hidden.std(correction=0)),
            "activation_min": float(hidden.min()),
            "activation_max": float(hidden.max()),
            "gradient_norm": norm,
        }
        net.zero_grad(set_to_none=True)  # as the engine does, before after_step
        run.progress.episode = episode
        hook.after_step(run, {}, loss)
        assert hooked(net) == (episode % 2 == 1)  # registered only for the next, measured step
        assert hook.needs_eager_step(run) == (episode % 2 == 1)  # (compiled models: eager)
    hook.after_train(run, {})
    close_logger(log)

    rows = rows_of(tmp_path / "reports" / "layer_statistics.csv")
    assert [(r["episode"], r["layer"]) for r in rows] == [
        (str(e), f"net.body.{i}") for e in (1, 2, 4) for i in range(3)
    ]
    for row in rows:
        assert (row["gradient_norm"] == "") == row["layer"].endswith(".1")  # ReLU: no weights
        if row["layer"] == "net.body.0":
            for key, value in expected[int(row["episode"])].items():
                assert float(row[key]) == pytest.approx(value, rel=1e-5, abs=1e-30), key
    text = (tmp_path / "run.log").read_text()
    assert "episode 2: vanishing gradients (norm below 1e-07) in net.body.0" in text
    assert "episode 4: exploding gradients (norm above 1000) in net.body.0" in text


def test_an_fp16_step_the_scaler_skipped_is_not_called_exploding(tmp_path: Path) -> None:
    """Overflowed fp16 gradients are what a GradScaler expects now and then: it skips the step
    and halves its scale. Their non-finite norms are written, but not warned of as exploding."""
    torch.manual_seed(0)
    net = Net()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    run = fake_run(tmp_path, net, interval=1, scaler=scaler)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    hook = LayerStatistics(AnalysisConfig(layer_statistics=LayerStatisticsConfig(interval=1)))
    hook.before_train(run)
    before = [p.detach().clone() for p in net.parameters()]
    # The gradients overflow at this scale (1e36 * 65536 is above float32's largest).
    x = torch.randn(16, 4)
    loss = 1e36 * net(x).sum()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    assert scaler.get_scale() == 2.0**15
    optimizer.zero_grad(set_to_none=True)
    run.progress.episode = 1
    hook.after_step(run, {}, loss)
    hook.after_train(run, {})
    close_logger(run.log)
    norms = {
        r["layer"]: float(r["gradient_norm"])
        for r in rows_of(tmp_path / "reports" / "layer_statistics.csv")
        if r["gradient_norm"]
    }
    assert set(norms) == {"net.body.0", "net.body.2"}
    assert not any(math.isfinite(norm) for norm in norms.values())
    text = (tmp_path / "run.log").read_text()
    assert (
        "episode 1: fp16 gradients overflowed in net.body.0, net.body.2 at scale 65536; the "
        "gradient scaler skips such a step and lowers its scale" in text
    )
    assert "exploding" not in text


def test_an_overflowed_micro_batch_before_the_scaler_s_update_is_not_called_exploding(
    tmp_path: Path,
) -> None:
    """With gradient accumulation a measured micro-batch is reported before the window's
    optimizer step, so before the scaler has lowered its scale: an overflow is told by the
    non-finite norm itself under an fp16 scaler. Without one, inf still explodes."""
    for scaler, said in (
        (torch.amp.GradScaler("cpu", init_scale=4.0), "gradients overflowed"),
        (torch.amp.GradScaler("cpu", enabled=False), "exploding gradients"),
    ):
        net = Net()
        folder = tmp_path / str(scaler.is_enabled())
        folder.mkdir()
        run = fake_run(folder, net, interval=1, scaler=scaler)
        hook = LayerStatistics(AnalysisConfig(layer_statistics=True))
        hook.before_train(run)
        scaler.scale(1e38 * net(torch.randn(4, 4)).sum()).backward()  # no step, no update
        run.progress.episode = 1
        hook.after_step(run, {}, torch.zeros(()))
        hook.after_train(run, {})
        close_logger(run.log)
        text = (folder / "run.log").read_text()
        assert said in text and ("exploding" in text) is (not scaler.is_enabled())


def test_statistics_of_several_calls_combine_exactly() -> None:
    values = [torch.randn(10), torch.randn(30) * 3 + 1]
    calls = [
        (len(v), [float(v.mean()), float(v.var(correction=0)), float(v.min()), float(v.max())])
        for v in values
    ]
    everything = torch.cat(values)
    combined = combine(calls)
    assert combined["activation_mean"] == pytest.approx(float(everything.mean()), rel=1e-5)
    assert combined["activation_std"] == pytest.approx(
        float(everything.std(correction=0)), rel=1e-5
    )
    assert combined["activation_max"] == pytest.approx(float(everything.max()))


def test_run_with_layer_statistics_is_bit_identical(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    config = AnalysisConfig(layer_statistics=LayerStatisticsConfig(interval=3))
    state = train(tmp_path_factory, [LayerStatistics(config)], tensorboard=1)
    assert_bit_identical(final_weights(state.run_dir), baseline_weights(tmp_path_factory))

    layers = [layer.name for layer in find_layers(state.pipeline)]
    assert len(layers) == 13 and "image_classifier.features.0" in layers  # LeNet-5's leaves
    rows = rows_of(state.run_dir / "reports" / "layer_statistics.csv")
    # 8 episodes: the first and every third measured; one row per layer.
    assert [(int(r["episode"]), r["layer"]) for r in rows] == [
        (episode, layer) for episode in (1, 3, 6) for layer in layers
    ]
    for row in rows:
        low, mean, high = (float(row[f"activation_{k}"]) for k in ("min", "mean", "max"))
        assert low <= mean <= high and float(row["activation_std"]) >= 0
        weighted = any(
            layer.name == row["layer"] and layer.parameters for layer in find_layers(state.pipeline)
        )
        assert (row["gradient_norm"] != "") == weighted
        if weighted:
            assert 0 < float(row["gradient_norm"]) < 100

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(state.run_dir / "tensorboard"))
    events.Reload()
    tag = "layers/image_classifier.features.0/gradient_norm"
    assert tag in events.Tags()["scalars"]
    assert [event.step for event in events.Scalars(tag)] == [1, 3, 6]


def test_compiled_models_run_eagerly_on_measured_steps(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # torch.compile neither calls nor notices forward hooks added to a compiled model's layers
    # after it compiled: without the eager steps the activation columns stay empty. (The eager
    # backend runs torch's graph capture without generating code, which is what matters here.)
    config = AnalysisConfig(layer_statistics=LayerStatisticsConfig(interval=3), model_summary=True)
    hooks = [ModelSummary(config), LayerStatistics(config)]
    state = train(tmp_path_factory, hooks, ["+training.compile={backend: eager}"])
    assert state.compiled_models == ["image_classifier"]
    rows = rows_of(state.run_dir / "reports" / "layer_statistics.csv")
    assert [int(r["episode"]) for r in rows[:: len(find_layers(state.pipeline))]] == [1, 3, 6]
    for row in rows:
        low, mean, high = (float(row[f"activation_{k}"]) for k in ("min", "mean", "max"))
        assert low <= mean <= high
    summary = (state.run_dir / "reports" / "model_summary.md").read_text(encoding="utf-8")
    assert "| image_classifier | features.0 | Conv2d | [64, 6, 28, 28] |" in summary

    # The eager stance lasted only the measured steps: torch.compile compiles again.
    compiled: list[int] = []

    def counting_backend(graph: torch.fx.GraphModule, inputs: Any) -> Any:
        compiled.append(1)
        return graph.forward

    torch.compile(lambda x: x + 1, backend=counting_backend)(torch.ones(2))
    assert compiled == [1]
