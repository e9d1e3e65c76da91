"""Worst samples: per-sample losses by id across epochs, checkpointed, exported; training with
the hook stays bit-identical.

The small-run helpers at the top are shared by the other analysis hook tests (they import
them from here): a LeNet-5 run on 256 MNIST images, 4 steps an epoch, 2 epochs.
"""

from __future__ import annotations

import csv
import io
import logging
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from torchloom.analysis.build import build_hooks
from torchloom.analysis.image_grid import caption_font, grid_layout
from torchloom.analysis.schema import AnalysisConfig, OutputSpec, WorstSamplesConfig
from torchloom.analysis.worst_samples import WorstSamples, caption
from torchloom.core.globals_store import GlobalsStore
from torchloom.core.streams import StreamSpec
from torchloom.engine.distributed import SINGLE
from torchloom.engine.setup import prepare_training
from torchloom.engine.state import Hook, Progress, RunView, TrainOptions
from torchloom.engine.trainer import TrainingLoop

SMALL_RUN = """\
default_configs: [loom://mnist/lenet5.yml]
training:
  task: {{data_folder: {data}, subset: 256}}
  dataloader: {{batch_size: 64}}
  seed: 11
  logging_interval: 2
  terminal_conditions: {{epoch_limit: 2}}
validation:
  task: {{subset: 64}}
test:
  task: {{subset: 64}}
"""
TRAINING_SAMPLES, EPOCHS = 256, 2
# A training task whose samples differ at every draw (padding 4, then a random 28x28 crop).
RANDOM_CROP = [
    "+training.task.transforms.random_crop.size=[28,28]",
    "+training.task.transforms.random_crop.padding=4",
]


def train(
    factory: pytest.TempPathFactory,
    hooks: Sequence[Hook],
    overrides: Sequence[str] = (),
    tensorboard: int = 0,
    analysis: bool = False,
) -> RunView:
    """A finished small run with these hooks (the state, for its run folder and objects);
    `analysis`: also the hooks of the config's analysis section, as `loom train` builds them."""
    root = factory.getbasetemp() / "analysis-hooks"
    root.mkdir(exist_ok=True)
    config = root / "small.yml"
    if not config.exists():  # one MNIST data folder for every test of the session
        config.write_text(SMALL_RUN.format(data=root / "mnist"), encoding="utf-8")
    options = TrainOptions(
        expdir=str(root / "runs"),
        quiet=True,
        tensorboard=tensorboard,
        hooks=list(hooks),
        hook_factory=build_hooks if analysis else None,
    )
    loop = prepare_training(config, list(overrides), options)
    assert isinstance(loop, TrainingLoop)
    loop.run()
    return loop.view


def final_weights(run_dir: Path) -> dict[str, dict[str, torch.Tensor]]:
    return dict(torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["components"])


_BASELINES: dict[tuple[str, ...], dict[str, dict[str, torch.Tensor]]] = {}


def baseline_weights(
    factory: pytest.TempPathFactory, overrides: Sequence[str] = ()
) -> dict[str, dict[str, torch.Tensor]]:
    """Final weights of the small run without hooks (trained once per session)."""
    key = tuple(overrides)
    if key not in _BASELINES:
        _BASELINES[key] = final_weights(train(factory, [], overrides).run_dir)
    return _BASELINES[key]


def assert_bit_identical(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for component in a:
        for key, tensor in a[component].items():
            assert torch.equal(tensor, b[component][key]), f"{component}.{key} differs"


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal, NaN where the other is NaN (samples not seen)."""
    return a.shape == b.shape and bool(torch.isclose(a, b, rtol=0, atol=0, equal_nan=True).all())


def png_pixels(path: Path) -> Any:
    import matplotlib.image

    return matplotlib.image.imread(path)


# ---- without training: a stand-in run ------------------------------------------------------
class TextTask:
    """Just enough of a task for the hook: a size, streams, samples with a text."""

    label = "task 'texts'"

    def __len__(self) -> int:
        return 10

    def output_specs(self) -> dict[str, StreamSpec]:
        return {"texts": StreamSpec(("batch",), str, "a text")}

    def stream_name(self, key: str) -> str:
        return key

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"texts": f"text | number {index}"}


def fake_run(tmp_path: Path) -> Any:
    loader = SimpleNamespace(task=TextTask())
    return SimpleNamespace(
        device=torch.device("cpu"),
        progress=Progress(),
        log=logging.getLogger("test.worst_samples"),
        train_data=loader,
        validation_data=loader,
        run_dir=tmp_path,
        seed=1,
        pipeline=SimpleNamespace(globals=GlobalsStore()),
        distributed=SINGLE,
    )


def batch_of(ids: list[int], classes: int = 3, seed: int = 0) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "predictions": torch.randn(len(ids), classes, generator=generator),
        "targets": torch.randint(0, classes, (len(ids),), generator=generator),
        "indices": torch.tensor(ids),
    }


def test_tracked_losses_equal_a_direct_computation(tmp_path: Path) -> None:
    hook = WorstSamples(AnalysisConfig())
    run = fake_run(tmp_path)
    hook.before_train(run)
    logits = batch_of([7, 2, 5, 0])
    hook.after_step(run, logits, torch.tensor(0.0))
    hook.flush()  # steps are held and written a block at a time
    (tracker,) = hook.trackers
    expected = F.cross_entropy(logits["predictions"], logits["targets"], reduction="none")
    assert torch.allclose(tracker.history[0, [7, 2, 5, 0]], expected)
    assert torch.isnan(tracker.history[0, [1, 3, 4, 6, 8, 9]]).all()
    # Log-probabilities give the same losses (log_softmax is idempotent).
    log_probabilities = {**logits, "predictions": logits["predictions"].log_softmax(dim=1)}
    run.progress.epoch = 1
    hook.after_step(run, log_probabilities, torch.tensor(0.0))
    hook.flush()
    assert torch.allclose(tracker.history[1, [7, 2, 5, 0]], expected, atol=1e-6)
    # Memory: one float per (epoch, sample), and an id-indexed target and prediction.
    assert tracker.history.shape == (2, 10) and tracker.history.dtype == torch.float32
    assert tracker.targets.shape == tracker.predictions.shape == (10,)
    assert tracker.predictions[[7, 2, 5, 0]].tolist() == logits["predictions"].argmax(1).tolist()


def test_history_survives_a_checkpoint_round_trip(tmp_path: Path) -> None:
    hook, run = WorstSamples(AnalysisConfig()), fake_run(tmp_path)
    hook.before_train(run)
    hook.after_step(run, batch_of([1, 2, 3]), torch.tensor(0.0))
    buffer = io.BytesIO()
    torch.save({"hooks": {hook.name: hook.state_dict()}}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)["hooks"]  # as checkpoints are read

    resumed = WorstSamples(AnalysisConfig())
    resumed.load_state_dict(saved[resumed.name])
    run.progress.epoch = 1
    resumed.before_train(run)
    assert same(resumed.trackers[0].history, hook.trackers[0].history)
    resumed.after_step(run, batch_of([4], seed=1), torch.tensor(0.0))
    resumed.flush()
    history = resumed.trackers[0].history
    assert history.shape == (2, 10) and not torch.isnan(history[1, 4])
    assert same(history[0], hook.trackers[0].history[0])


def test_validation_keeps_full_passes_and_exports_texts(tmp_path: Path) -> None:
    config = AnalysisConfig(
        worst_samples=WorstSamplesConfig(section="validation", count=3),
        outputs=[OutputSpec(texts="texts")],
    )
    hook, run = WorstSamples(config), fake_run(tmp_path)
    hook.before_train(run)
    hook.eval_batch(run, "validation", batch_of([0, 1, 2]))
    hook.after_eval(run, "validation", {}, partial=True)  # partial passes are not epochs
    assert hook.trackers[0].history.shape == (0, 10)
    hook.eval_batch(run, "validation", batch_of([0, 1, 2, 3, 4]))
    run.progress.epoch = 1
    hook.after_eval(run, "validation", {}, partial=False)
    assert hook.trackers[0].history.shape == (1, 10) and hook.trackers[0].labels == [1]
    folder = tmp_path / "reports" / "worst_samples"
    with open(folder / "worst.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    losses = [float(r["cumulative_loss"]) for r in rows]
    assert len(rows) == 3 and losses == sorted(losses, reverse=True)
    # The table and the heat map wait for the plotting budget, or for the end of the run.
    hook.after_train(run, {})
    table = (folder / "worst.md").read_text().splitlines()
    assert len(table) == 2 + 3 and all("text \\| number" in line for line in table[2:])
    assert png_pixels(folder / "heatmap.png").std() > 0


def test_worst_sample_captions_have_a_glyph_for_every_character() -> None:
    row = {
        "id": 59999,
        "cumulative_loss": 12.345,
        "target_label": "7 seven",
        "prediction_label": "3 three",
    }
    text = caption(row)
    assert text.splitlines() == ["#59999", "total loss 12.3", "true 7 seven", "pred 3 three"]
    _, characters = caption_font()
    assert set(text) - {"\n"} <= characters


# ---- a real run --------------------------------------------------------------------------
def test_run_with_worst_samples_is_bit_identical_and_reports(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    count = 8
    hook = WorstSamples(AnalysisConfig(worst_samples=WorstSamplesConfig(count=count)))
    state = train(tmp_path_factory, [hook])
    assert_bit_identical(final_weights(state.run_dir), baseline_weights(tmp_path_factory))

    history = hook.trackers[0].history
    assert history.shape == (EPOCHS, TRAINING_SAMPLES) and history.dtype == torch.float32
    assert not torch.isnan(history).any()  # every sample is seen in every epoch
    folder = state.run_dir / "reports" / "worst_samples"
    with open(folder / "worst.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    cumulative = history.sum(dim=0).cpu()
    assert [int(r["id"]) for r in rows] == cumulative.argsort(descending=True)[:count].tolist()
    for row in rows:
        assert float(row["cumulative_loss"]) == pytest.approx(
            float(cumulative[int(row["id"])]), rel=1e-5
        )
        assert float(row["last_loss"]) == pytest.approx(
            float(history[-1, int(row["id"])]), rel=1e-5
        )
    heatmap = png_pixels(folder / "heatmap.png")
    assert heatmap.std() > 0.05
    grid = png_pixels(folder / "worst.png")
    layout = grid_layout(count, caption_lines=4)  # id, total loss, truth, prediction
    assert grid.shape[:2] == (layout.height, layout.width) and grid.std() > 0.05
    # The checkpoint carries the history for a resumed run.
    saved = torch.load(state.run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert torch.equal(saved["hooks"]["worst_samples"]["predictions"]["history"], history.cpu())


def test_a_sample_seen_twice_in_a_block_keeps_its_last_loss_target_and_prediction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a GPU, which of repeated indices `index_copy_` writes last is not fixed (and each of
    the three copies could choose another): the block's duplicates now all carry the last
    values. A copy that writes the first of them, as a GPU may, is imitated here."""
    from torchloom.analysis.loss_history import LossHistory, last_occurrence

    assert last_occurrence(torch.tensor([3, 1, 3, 0, 1, 3])).tolist() == [5, 4, 5, 3, 4, 5]
    original = torch.Tensor.index_copy_

    def first_wins(self: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor) -> Any:
        return original(self, dim, index.flip(0), source.flip(0))

    monkeypatch.setattr(torch.Tensor, "index_copy_", first_wins)
    history = LossHistory(OutputSpec(), 5, torch.device("cpu"))
    row = history.blank_row()
    scores = torch.tensor([[4.0, 0.0], [0.0, 1.0], [0.0, 4.0]])
    targets = torch.tensor([0, 1, 0])
    history.observe_block(scores, targets, torch.tensor([2, 4, 2]), row)
    assert row[2] == F.cross_entropy(scores[2:], targets[2:])
    assert (history.targets[2], history.predictions[2]) == (0, 1)


def test_a_target_outside_the_classes_has_no_loss_rather_than_ending_the_run() -> None:
    """A loss with `ignore_index: -1` (or an indexer's) leaves targets -1 in the batch:
    cross_entropy raised on them (only -100 is its default), and the hook's error ended the
    run with a traceback."""
    from torchloom.analysis.loss_history import LossHistory

    history = LossHistory(OutputSpec(), 5, torch.device("cpu"))
    row = history.blank_row()
    scores = torch.tensor([[4.0, 0.0], [0.0, 1.0], [0.0, 4.0]])
    history.observe_block(scores, torch.tensor([1, -1, 2]), torch.tensor([0, 1, 2]), row)
    assert row[0] == F.cross_entropy(scores[:1], torch.tensor([1]))
    assert torch.isnan(row[1:]).all()  # unseen: no loss to rank them by


def test_ids_that_are_not_positions_in_the_split_are_refused_at_the_first_batch(
    tmp_path: Path,
) -> None:
    """A user-named ids stream of other ids (file numbers, say) indexed past the history: on
    the CPU an IndexError that failed the run, on a GPU a device-side assert after which not
    even last.pt could be saved. The first batch's ids are read once; such an output is
    skipped, saying why, and training goes on."""
    hook = WorstSamples(AnalysisConfig())
    run = fake_run(tmp_path)
    hook.before_train(run)
    batch = batch_of([7, 2, 5, 0])
    batch["indices"] = torch.tensor([7, 2, 15, 0])  # 15: past the split's 10 samples
    hook.after_step(run, batch, torch.tensor(0.0))
    hook.after_step(run, batch_of([1, 3]), torch.tensor(0.0))  # the output stays skipped
    hook.flush()
    (tracker,) = hook.trackers
    assert tracker.history.shape[0] == 0  # nothing observed
    from torchloom.analysis.skipped import read_skipped

    (why,) = read_skipped(tmp_path).values()
    assert "its ids stream 'indices' holds 0 to 15, not positions in the split (0 to 9)" in why


def test_only_the_epoch_being_written_is_on_the_device() -> None:
    """The history was one tensor [epochs, samples] on the run's device, growing by a row
    every epoch (ImageNet: 5 MB an epoch of GPU memory, doubled at each epoch's copy). The
    row being written is on the device; the others are kept on the host, values intact."""
    from torchloom.analysis.loss_history import LossHistory

    history = LossHistory(OutputSpec(), 6, torch.device("cpu"))
    ids = torch.tensor([1, 4])
    for epoch in range(3):
        row = history.row_for_epoch(epoch)
        assert history.row(epoch) is row and history.row_for_epoch(epoch) is row
        history.observe_block(torch.randn(2, 3), torch.tensor([0, 2]), ids + epoch % 2, row)
    assert history.open is not None and history.open[0] == 2
    assert history.kept.device.type == "cpu" and history.kept.shape == (3, 6)
    assert history.row(0) is not None and history.row(0).data_ptr() == history.kept[0].data_ptr()
    seen = ~torch.isnan(history.history)
    assert seen.sum(dim=1).tolist() == [2, 2, 2] and seen[1, [2, 5]].all()
    assert history.row(3) is None
