"""How runs end, resume and refuse, on toy pipelines in this process (a second each): every
way out writes a final status, a finished run is not run again, a resumed run is the run that
was started, checkpoints are checked, a run folder has one trainer at a time, and components
keep the promises of their specs."""

from __future__ import annotations

import os
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

import torchloom
from live_processes import children
from torchloom.engine.checkpoint import DIGEST_KEY, load_checkpoint, set_deterministic
from torchloom.engine.run_lock import RunLock, run_liveness
from torchloom.engine.state import Hook, RunView
from torchloom.errors import ComponentError, ConfigError, DataError, StorageError, WeightsError
from toy_runs import StopAt, model_weights, only_run, start, summary, toy_config, train, write


class CrashAfterInterval(Hook):
    name = "crash"

    def after_interval(self, run: RunView) -> None:
        raise ValueError("the hook broke")


# ---- every way out writes a final status ---------------------------------------------------
def test_a_component_bug_ends_the_run_as_failed_with_its_message(tmp_path: Path) -> None:
    config = toy_config()
    config["pipeline"]["bug"] = {"type": "trust_components:FailsAtStep", "at": 3}
    with pytest.raises(RuntimeError, match="boom at step 3"):
        train(write(tmp_path, config), tmp_path / "runs")
    run = only_run(tmp_path / "runs")
    ended = summary(run)
    assert ended["status"] == "failed"
    assert ended["reason"] == "RuntimeError: boom at step 3"  # one line
    assert ended["episodes"] == 2  # the step that failed did not count
    assert not run_liveness(run).alive  # the lock went with the run
    assert "failed: RuntimeError: boom at step 3" in (run / "run.log").read_text()


def test_an_operation_without_a_deterministic_version_names_training_deterministic(
    tmp_path: Path,
) -> None:
    """In deterministic mode torch refuses an operation it has no deterministic version of
    (here `put_`; on a GPU, the backward pass of several layers): that is the config asking
    for what the pipeline cannot do, a config error naming the key, not an internal bug."""
    config = toy_config(deterministic=True)
    config["pipeline"]["model"]["type"] = "trust_components:PutsInPlace"
    try:
        with pytest.raises(ConfigError, match=r"training\.deterministic") as error:
            train(write(tmp_path, config), tmp_path / "runs")
    finally:
        set_deterministic(False)  # the run turned it on for this whole process
    message = str(error.value)
    assert "no deterministic version of put_" in message
    assert "set training.deterministic: false" in message
    run = only_run(tmp_path / "runs")
    assert f"{run / 'config.yaml'}: training.deterministic" in message
    ended = summary(run)
    assert ended["status"] == "failed" and ended["reason"].startswith("config error:")


def test_lr_find_names_training_deterministic_as_loom_train_does(tmp_path: Path) -> None:
    """The learning-rate finder's sweep meets torch's refusal as a run does: a config error
    naming the key (exit 2 for `loom lr-find`), not a traceback."""
    from torchloom.analysis.lr_find import lr_find

    config = toy_config(deterministic=True)
    config["pipeline"]["model"]["type"] = "trust_components:PutsInPlace"
    try:
        with pytest.raises(ConfigError, match=r"training\.deterministic") as error:
            lr_find(write(tmp_path, config), [], expdir=tmp_path / "runs", steps=8, device="cpu")
    finally:
        set_deterministic(False)
    assert "no deterministic version of put_" in str(error.value)


def test_a_crash_in_a_hook_ends_the_run_as_failed(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="the hook broke"):
        train(write(tmp_path, toy_config()), tmp_path / "runs", CrashAfterInterval())
    ended = summary(only_run(tmp_path / "runs"))
    assert ended["status"] == "failed" and ended["reason"] == "ValueError: the hook broke"


def test_a_full_disk_is_a_storage_error_that_keeps_the_last_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torchloom.engine.checkpoint as checkpoints

    saves = {"count": 0}
    real_save = torch.save

    def save_until_full(obj: Any, handle: Any) -> None:
        saves["count"] += 1
        if saves["count"] == 3:  # last.pt and best.pt of epoch 1 fit; then the disk is full
            handle.write(b"partial")
            raise OSError(28, "No space left on device")
        real_save(obj, handle)

    monkeypatch.setattr(checkpoints.torch, "save", save_until_full)
    with pytest.raises(StorageError) as raised:
        train(write(tmp_path, toy_config()), tmp_path / "runs")
    run = only_run(tmp_path / "runs")
    assert "cannot write the checkpoint: No space left on device" in raised.value.format()
    assert str(run / "checkpoints") in raised.value.format()
    kept = load_checkpoint(run / "checkpoints" / "last.pt")
    assert kept["progress"]["epoch"] == 1  # the previous checkpoint, whole and checked
    assert not [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    assert summary(run)["status"] == "failed"


# ---- a finished run is not run again --------------------------------------------------------
def test_resuming_a_finished_run_does_nothing_unless_a_limit_is_raised(tmp_path: Path) -> None:
    first = train(write(tmp_path, toy_config()), tmp_path / "runs")
    run = first.run_dir
    files = {name: (run / name).read_bytes() for name in ("run.log", "test_statistics.csv")}
    again = train(None, tmp_path / "runs", resume=run)
    assert again.already_finished and again.status == "epoch_limit"
    for name, content in files.items():
        assert (run / name).read_bytes() == content, f"{name} changed"
    longer = train(
        None,
        tmp_path / "runs",
        resume=run,
        overrides=["training.terminal_conditions.epoch_limit=3"],
    )
    assert not longer.already_finished and longer.summary["epochs"] == 3
    tests = (run / "test_statistics.csv").read_text().strip().splitlines()
    assert len(tests) == 3 and tests[1].split(",")[0] == "2" and tests[2].split(",")[0] == "3"
    assert (
        "# override on resume at episode 10: training.terminal_conditions.epoch_limit=3"
        in (run / "config.yaml").read_text()
    )


# ---- a resumed run is the run that was started ----------------------------------------------
def test_an_edited_config_is_refused_naming_the_changed_keys(tmp_path: Path) -> None:
    result = train(write(tmp_path, toy_config()), tmp_path / "runs", StopAt(3))
    assert result.status == "interrupted"
    config = result.run_dir / "config.yaml"
    assert not config.stat().st_mode & 0o222, "config.yaml is written read-only"
    text = config.read_text()
    config.chmod(0o644)
    config.write_text(text.replace("lr: 0.1", "lr: 0.5").replace("seed: 3", "seed: 4"))
    with pytest.raises(ConfigError) as raised:
        start(None, tmp_path / "runs", resume=result.run_dir)
    message = raised.value.format()
    assert "training.optimizer.lr (0.1 -> 0.5)" in message
    assert "training.seed (3 -> 4)" in message
    assert not run_liveness(result.run_dir).alive


class FailsAtStart(Hook):
    name = "fails_at_start"

    def before_train(self, run: RunView) -> None:
        raise RuntimeError("the session failed before its first save")


def test_a_resume_that_failed_before_its_first_save_can_be_resumed_again(tmp_path: Path) -> None:
    """config.yaml records a resume's overrides when it starts: a session that failed before
    saving left config.yaml and last.pt apart, and every later resume was refused as an
    edit, the same override included."""
    result = train(write(tmp_path, toy_config()), tmp_path / "runs", StopAt(3))
    limit = "training.terminal_conditions.epoch_limit=3"
    with pytest.raises(RuntimeError):
        train(None, tmp_path / "runs", FailsAtStart(), resume=result.run_dir, overrides=[limit])
    resumed = train(None, tmp_path / "runs", resume=result.run_dir)
    assert resumed.status == "epoch_limit" and summary(result.run_dir)["epochs"] == 3


def test_resume_overrides_may_change_only_the_safe_keys(tmp_path: Path) -> None:
    result = train(write(tmp_path, toy_config()), tmp_path / "runs", StopAt(3))
    with pytest.raises(ConfigError) as raised:
        start(None, tmp_path / "runs", resume=result.run_dir, overrides=["training.optimizer.lr=1"])
    assert "training.optimizer.lr (0.1 -> 1)" in raised.value.format()
    resumed = train(
        None,
        tmp_path / "runs",
        resume=result.run_dir,
        overrides=["training.logging_interval=3"],
    )
    assert resumed.status == "epoch_limit"


def test_a_resume_that_disables_a_component_is_refused_without_overrides_too(
    tmp_path: Path,
) -> None:
    """`--resume RUN --disable X` with no overrides was accepted, unrecorded: a second loss
    disabled halved what the steps minimised and what best.pt was judged on."""
    from torchloom.engine.setup import TrainOptions, prepare_training

    config = toy_config()
    config["pipeline"]["extra_loss"] = {
        "type": "toy_components:ToyLoss",
        "streams": {"loss": "loss2"},
    }
    result = train(write(tmp_path, config), tmp_path / "runs", StopAt(3))
    options = TrainOptions(expdir=str(tmp_path / "runs"), quiet=True, disable=("extra_loss",))
    with pytest.raises(ConfigError) as raised:
        prepare_training(None, (), options, resume=result.run_dir)
    assert "pipeline.disable" in raised.value.format()
    assert "--disable extra_loss" in raised.value.format()


def test_an_online_run_s_logging_interval_is_not_changed_on_resume_where_it_paces_validation(
    tmp_path: Path,
) -> None:
    """Online, without partial_validation_interval, the logging interval is how often the
    monitor and early stopping judge: a resume with 1 validated at every step (patience then
    counted single steps)."""
    config = toy_config(mode="online")
    result = train(write(tmp_path, config), tmp_path / "runs", StopAt(3))
    with pytest.raises(ConfigError, match=r"training\.logging_interval"):
        start(
            None,
            tmp_path / "runs",
            resume=result.run_dir,
            overrides=["training.logging_interval=1"],
        )
    config["validation"]["partial_validation_interval"] = 2  # then it paces the rows alone
    (tmp_path / "own").mkdir()
    result = train(write(tmp_path / "own", config), tmp_path / "own" / "runs", StopAt(3))
    resumed = train(
        None,
        tmp_path / "own" / "runs",
        resume=result.run_dir,
        overrides=["training.logging_interval=1"],
    )
    assert resumed.status == "epoch_limit"


def test_a_held_out_split_over_another_size_than_its_training_side_is_refused(
    tmp_path: Path,
) -> None:
    """`complement: true` holds out what a `fraction` subset leaves, when both permute the
    same number of positions: with a training task of 40 samples and a validation task of
    16 (a subset in one section only), the validation samples were training ones too."""
    config = toy_config()
    config["training"]["sampler"] = {"type": "subset", "fraction": 0.75}
    config["validation"]["sampler"] = {"type": "subset", "fraction": 0.75, "complement": True}
    with pytest.raises(DataError, match="over 16 samples where training has 40") as refused:
        train(write(tmp_path, config), tmp_path / "runs")
    assert "validation.sampler" in refused.value.format()
    config["validation"]["task"]["size"] = 40  # the same data: the two sides agree
    assert train(write(tmp_path, config), tmp_path / "runs").status == "epoch_limit"


def test_a_stopped_run_with_gradient_accumulation_resumes_bit_identical(tmp_path: Path) -> None:
    # A stop between two optimizer steps: the gradients summed so far go into last.pt.
    config = write(tmp_path, toy_config(gradient_accumulation=3, checkpoint_interval=2))
    reference = train(config, tmp_path / "reference")
    stopped = train(config, tmp_path / "runs", StopAt(4))
    assert stopped.status == "interrupted" and stopped.summary["episodes"] == 4
    resumed = train(None, tmp_path / "runs", resume=stopped.run_dir)
    for key, tensor in model_weights(reference.run_dir).items():
        assert torch.equal(tensor, model_weights(resumed.run_dir)[key]), key


class StopDuringValidation(Hook):
    """A second Ctrl-C during the first validation pass: the run stops at once."""

    name = "stop_in_validation"

    def eval_batch(self, run: RunView, section: str, batch: Any) -> None:
        if section == "validation":
            raise KeyboardInterrupt


def test_a_run_saved_after_its_last_partial_batch_resumes(tmp_path: Path) -> None:
    # 40 samples in batches of 16: the epoch's third batch has 8. A save after it (every 3
    # episodes), then a stop during validation, left a last.pt at the epoch's very end.
    settings = toy_config(dataloader={"batch_size": 16}, checkpoint_interval=3)
    settings["pipeline"]["accuracy"] = {"type": "AccuracyStatistics"}  # torchmetrics counts
    config = write(tmp_path, settings)
    reference = train(config, tmp_path / "reference")
    with pytest.raises(KeyboardInterrupt):
        train(config, tmp_path / "runs", StopDuringValidation())
    run = only_run(tmp_path / "runs")
    saved = load_checkpoint(run / "checkpoints" / "last.pt")["progress"]
    assert (saved["epoch"], saved["batch_in_epoch"]) == (0, 3)
    assert summary(run)["status"] == "interrupted"
    resumed = train(None, tmp_path / "runs", resume=run)
    assert resumed.status == "epoch_limit"
    for key, tensor in model_weights(reference.run_dir).items():
        assert torch.equal(tensor, model_weights(run)[key]), key
    for name in ("training_epoch_statistics.csv", "validation_epoch_statistics.csv"):
        assert (run / name).read_text() == (reference.run_dir / name).read_text(), name


# ---- one trainer per run folder --------------------------------------------------------------
def test_a_run_folder_held_by_a_trainer_refuses_a_second(tmp_path: Path) -> None:
    result = train(write(tmp_path, toy_config()), tmp_path / "runs", StopAt(3))
    held = RunLock(result.run_dir).acquire()
    try:
        with pytest.raises(ConfigError) as raised:
            start(None, tmp_path / "runs", resume=result.run_dir)
        assert "is in use by process" in raised.value.format()
        assert str(held.path.parent) in raised.value.format()
    finally:
        held.release()
    assert train(None, tmp_path / "runs", resume=result.run_dir).status == "epoch_limit"


def test_a_run_held_before_its_first_checkpoint_is_said_to_be_in_use(tmp_path: Path) -> None:
    """A resume of a run whose trainer has not saved yet was told the folder has no
    checkpoints, as if it were no run: it is one, in use by that process."""
    result = train(write(tmp_path, toy_config()), tmp_path / "runs", StopAt(3))
    run = result.run_dir
    (run / "checkpoints").rename(tmp_path / "saved")  # as before the first save
    held = RunLock(run).acquire()
    try:
        with pytest.raises(ConfigError) as raised:
            start(None, tmp_path / "runs", resume=run)
    finally:
        held.release()
    message = raised.value.format()
    assert f"is in use by process {os.getpid()}" in message and "no checkpoints" not in message
    assert "it has saved no checkpoint yet" in message
    with pytest.raises(ConfigError, match="no checkpoints/"):  # held by none: not resumable
        start(None, tmp_path / "runs", resume=run)


# ---- checkpoints are checked --------------------------------------------------------------
def flip_a_bit_in_the_largest_tensor(path: Path) -> None:
    with zipfile.ZipFile(path) as archive:
        entry = max(
            (i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size
        )
    data = bytearray(path.read_bytes())
    header = entry.header_offset
    name_length = int.from_bytes(data[header + 26 : header + 28], "little")
    extra_length = int.from_bytes(data[header + 28 : header + 30], "little")
    start_of_data = header + 30 + name_length + extra_length
    data[start_of_data + entry.file_size // 2] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_damaged_last_pt_is_an_error_and_resume_falls_back_to_the_previous(
    tmp_path: Path,
) -> None:
    config = write(tmp_path, toy_config(epochs=3))
    reference = train(config, tmp_path / "reference")
    stopped = train(config, tmp_path / "runs", StopAt(7))  # after epoch 1 (5 episodes each)
    last = stopped.run_dir / "checkpoints" / "last.pt"
    flip_a_bit_in_the_largest_tensor(last)
    with pytest.raises(DataError, match="is damaged"):
        load_checkpoint(last)
    resumed = train(None, tmp_path / "runs", resume=stopped.run_dir)
    log = (stopped.run_dir / "run.log").read_text()
    assert "resuming from last.prev.pt instead (episode 5)" in log
    for key, tensor in model_weights(reference.run_dir).items():
        assert torch.equal(tensor, model_weights(resumed.run_dir)[key]), key


def test_a_fallback_resume_keeps_the_good_checkpoint_whatever_the_next_save_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After falling back to last.prev.pt, the next save linked the damaged last.pt over it
    before writing: a save that then failed (a full disk) left no good checkpoint at all."""
    from torchloom.data.atomic_files import PendingFile

    stopped = train(write(tmp_path, toy_config(epochs=3)), tmp_path / "runs", StopAt(7))
    folder = stopped.run_dir / "checkpoints"
    flip_a_bit_in_the_largest_tensor(folder / "last.pt")

    commit = PendingFile.commit

    def full_disk(self: PendingFile, durable: bool = False) -> None:
        if self.dest.name == "last.pt":  # at the flush, after the rotation
            raise OSError(28, "No space left on device")
        commit(self, durable)

    monkeypatch.setattr(PendingFile, "commit", full_disk)
    with pytest.raises(StorageError):
        train(None, tmp_path / "runs", resume=stopped.run_dir)
    assert load_checkpoint(folder / "last.prev.pt")["progress"]["episode"] == 5
    assert (folder / "last.damaged.pt").exists()


def test_a_checkpoint_whose_digest_was_removed_is_damaged_not_trusted(tmp_path: Path) -> None:
    """Format 2 always carries its digest: one without it was changed after saving (and the
    digest of a sharded checkpoint's shards sits in it), so it is refused like a bad digest."""
    stopped = train(write(tmp_path, toy_config()), tmp_path / "runs", StopAt(2))
    last = stopped.run_dir / "checkpoints" / "last.pt"
    state = torch.load(last, map_location="cpu", weights_only=True)
    assert state["format"] == 2 and DIGEST_KEY in state
    del state[DIGEST_KEY]
    torch.save(state, last)
    with pytest.raises(DataError, match="is damaged: it has no SHA-256 digest"):
        load_checkpoint(last)


def test_another_models_checkpoint_names_the_weight_and_both_shapes(tmp_path: Path) -> None:
    other = toy_config()
    other["pipeline"]["model"]["type"] = "trust_components:WideLinear"
    foreign = train(write(tmp_path, other, "other.yml"), tmp_path / "other", StopAt(2))
    stopped = train(write(tmp_path, toy_config()), tmp_path / "runs", StopAt(2))
    target = stopped.run_dir / "checkpoints" / "last.pt"
    target.write_bytes((foreign.run_dir / "checkpoints" / "last.pt").read_bytes())
    with pytest.raises(WeightsError) as raised:
        start(None, tmp_path / "runs", resume=stopped.run_dir)
    message = raised.value.format()
    assert "component 'model' (ToyLinear)" in message
    assert "weight 'linear.weight' has shape [3, 5]" in message and "but [3, 4]" in message
    assert "pipeline.model.type ('trust_components:WideLinear' -> " in message


# ---- components keep their word --------------------------------------------------------------
@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("WrongKeyModel", "returned stream 'preds', which it does not declare"),
        ("TooManyClasses", "has size 5 in dimension 1 ('classes'), but it declares 3"),
        ("FlatPredictions", "has shape [24] (rank 1), but it declares [batch, classes=3] (rank 2)"),
        ("IntegerPredictions", "has element type int64, but it declares"),
    ],
)
def test_the_first_batch_names_a_component_that_breaks_its_specs(
    tmp_path: Path, model: str, expected: str
) -> None:
    config = toy_config()
    config["pipeline"]["model"]["type"] = f"trust_components:{model}"
    with pytest.raises(ComponentError) as raised:
        train(write(tmp_path, config), tmp_path / "runs")
    message = raised.value.format()
    assert f"[training] component 'model' ({model})" in message and expected in message
    assert "toy.yml" in message


def test_interval_rows_count_the_interval_and_epoch_rows_the_epoch(tmp_path: Path) -> None:
    result = train(write(tmp_path, toy_config()), tmp_path / "runs")
    intervals = (result.run_dir / "training_statistics.csv").read_text().splitlines()
    header = intervals[0].split(",")
    seen = [float(row.split(",")[header.index("seen")]) for row in intervals[1:]]
    # logging_interval 2 x batch 8; the epoch's 5th batch opens the next interval
    assert seen == [16.0, 16.0, 16.0, 16.0, 16.0][: len(seen)] and len(seen) == 5
    epochs = (result.run_dir / "training_epoch_statistics.csv").read_text().splitlines()
    epoch_header = epochs[0].split(",")
    assert [float(r.split(",")[epoch_header.index("seen")]) for r in epochs[1:]] == [40.0, 40.0]


def test_the_python_api_says_a_finished_run_is_finished(tmp_path: Path) -> None:
    first = torchloom.train(toy_config(), expdir=str(tmp_path / "runs"), analysis=False)
    again = torchloom.train(resume=first.run_dir, analysis=False)
    assert again.already_finished and again.summary == first.summary


def rename_a_global_in_the_pickle(path: Path) -> None:
    """Turn `torch._utils` into `os.system.xx` inside the checkpoint's pickle: a damaged (or
    hostile) file that asks the unpickler for code."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        entry = next(i for i in archive.infolist() if i.filename.endswith("data.pkl"))
    header = entry.header_offset
    start_of_data = header + 30 + int.from_bytes(data[header + 26 : header + 28], "little")
    start_of_data += int.from_bytes(data[header + 28 : header + 30], "little")
    where = data.index(b"torch._utils", start_of_data)
    data[where : where + 12] = b"os.system.xx"
    path.write_bytes(bytes(data))


def test_a_damaged_checkpoint_is_named_without_torchs_unpickling_advice(tmp_path: Path) -> None:
    result = train(write(tmp_path, toy_config(epochs=1)), tmp_path / "runs")
    best = result.run_dir / "checkpoints" / "best.pt"
    rename_a_global_in_the_pickle(best)
    with pytest.raises(DataError) as raised:
        load_checkpoint(best)
    message = raised.value.format()
    assert f"checkpoint '{best}': cannot be read: it holds more than tensors" in message
    assert "os.system.xx" in message and "torchloom never unpickles code" in message
    assert "weights_only" not in message and "trust" not in message
    truncated = result.run_dir / "checkpoints" / "last.pt"
    truncated.write_bytes(truncated.read_bytes()[:300])
    with pytest.raises(DataError, match="cannot be read: PytorchStreamReader failed"):
        load_checkpoint(truncated)


def test_every_statistics_file_numbers_epochs_alike(tmp_path: Path) -> None:
    # Online mode: partial validations inside epoch 1 are numbered 1, as the interval rows of
    # epoch 1 and epoch 1's own row are (they were numbered 0 while interval rows said 1).
    config = toy_config(mode="online")
    config["validation"]["partial_validation_interval"] = 2
    result = train(write(tmp_path, config), tmp_path / "runs")

    def epochs(name: str) -> list[tuple[int, int]]:
        lines = (result.run_dir / name).read_text().splitlines()
        header = lines[0].split(",")
        return [
            (
                int(row.split(",")[header.index("episode")]),
                int(row.split(",")[header.index("epoch")]),
            )
            for row in lines[1:]
        ]

    assert epochs("validation_statistics.csv") == [(2, 1), (4, 1), (6, 2), (8, 2), (10, 2)]
    assert epochs("training_statistics.csv") == [(2, 1), (4, 1), (6, 2), (8, 2), (10, 2)]
    assert epochs("training_epoch_statistics.csv") == [(5, 1), (10, 2)]
    assert epochs("validation_epoch_statistics.csv") == [(10, 2)]  # the final full pass


def test_the_progress_bar_counts_every_batch_and_shows_each_interval_rows_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import csv

    import torchloom.engine.trainer as trainer_module
    from torchloom.engine.setup import TrainOptions, prepare_training

    class Bar:
        def __init__(self, total: int) -> None:
            self.total, self.done, self.postfixes = total, 0, []

        def update(self, count: int) -> None:
            self.done += count

        def set_postfix(self, **values: str) -> None:
            self.postfixes.append(values)

        def close(self) -> None:
            pass

    bars: list[Bar] = []

    def bar(total: int, epoch: int, enabled: bool, initial: int = 0) -> Bar:
        assert enabled and initial == 0
        bars.append(Bar(total))
        return bars[-1]

    monkeypatch.setattr(trainer_module, "progress_bar", bar)
    options = TrainOptions(expdir=str(tmp_path / "runs"), quiet=False, tensorboard=0)
    loop = prepare_training(write(tmp_path, toy_config()), (), options)
    assert not isinstance(loop, torchloom.RunResult)
    result = loop.run()
    with open(result.run_dir / "training_statistics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(b.total, b.done) for b in bars] == [(5, 5), (5, 5)]  # 40 samples, batch 8
    shown = [p["loss"] for b in bars for p in b.postfixes]
    assert shown == [f"{float(row['loss']):.4f}" for row in rows] and len(shown) == 5


class SlowSteps(Hook):
    """Every step takes at least `seconds`: a rate above batch / seconds is impossible."""

    name = "slow_steps"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def after_step(self, run: RunView, batch: Any, loss: torch.Tensor) -> None:
        import time

        time.sleep(self.seconds)


def test_a_resumed_interval_s_rate_divides_its_samples_by_its_whole_time(tmp_path: Path) -> None:
    """Stopped two steps into an interval of four: the interval's samples were restored but
    its time began again, so the row's samples_per_second counted the first session's samples
    over the second session's time alone."""
    import csv

    config = write(tmp_path, toy_config(logging_interval=4))
    stopped = train(config, tmp_path / "runs", StopAt(2), SlowSteps(0.2))
    train(None, tmp_path / "runs", SlowSteps(0.2), resume=stopped.run_dir)
    with open(stopped.run_dir / "training_statistics.csv", encoding="utf-8") as file:
        first = next(csv.DictReader(file))
    assert int(first["episode"]) == 4
    assert float(first["samples_per_second"]) <= 8 / 0.2  # batches of 8


def test_tensorboard_keeps_the_rows_at_the_checkpoint_s_episode_after_a_resume(
    tmp_path: Path,
) -> None:
    """Rows at the checkpoint's episode are written before its save and kept in the CSV
    files; TensorBoard purged them from that episode on, and they were never written again."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from torchloom.engine.setup import TrainOptions, prepare_training

    config = write(tmp_path, toy_config(epochs=2))

    def run(*hooks: Hook, resume: Path | None = None) -> Any:
        options = TrainOptions(
            expdir=str(tmp_path / "runs"), quiet=True, tensorboard=1, hooks=hooks, device="cpu"
        )
        return prepare_training(None if resume else config, (), options, resume=resume).run()

    stopped = run(StopAt(6))
    run(resume=stopped.run_dir)
    events = EventAccumulator(str(stopped.run_dir / "tensorboard"))
    events.Reload()
    assert [event.step for event in events.Scalars("training/loss")] == [2, 4, 6, 8, 10]


def test_a_training_batch_of_one_that_batch_norm_refuses_is_a_config_error(tmp_path: Path) -> None:
    """torch's ValueError ("Expected more than 1 value per channel when training") ended the
    run as an internal error with a traceback: a last batch of one sample (the split's size
    leaves one over), through a layer that normalises 1x1 maps. It names drop_last."""
    from torchloom.engine.run_folder import as_user_error

    raised = torch.nn.BatchNorm1d(4).train()
    with pytest.raises(ValueError) as caught:
        raised(torch.randn(1, 4))
    error = as_user_error(caught.value, tmp_path)
    assert isinstance(error, ConfigError)
    assert "drop_last: true" in error.format() and "training.dataloader" in error.format()


def test_an_epoch_without_a_batch_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """40 samples in batches of 64 with drop_last: `loom train` ended "epoch_limit" after no
    step with a NaN accuracy, and `loom lr-find` looped for ever over empty epochs."""
    from torchloom.cli.main import main

    config = write(tmp_path, toy_config(dataloader={"batch_size": 64, "drop_last": True}))
    runs = tmp_path / "runs"
    assert main(["train", str(config), "--expdir", str(runs), "--device", "cpu"]) == 2
    error = capsys.readouterr().err
    assert "training.dataloader.drop_last" in error and "40 sample(s)" in error
    assert "use a batch_size of at most 40" in error and "Traceback" not in error
    assert not runs.exists()
    lr_find = ["lr-find", str(config), "--steps", "10", "--expdir", str(runs), "--device", "cpu"]
    assert main(lr_find) == 2
    assert "training.dataloader.drop_last" in capsys.readouterr().err
    empty = toy_config()
    empty["validation"]["task"]["size"] = 0
    assert main(["train", str(write(tmp_path, empty)), "--expdir", str(runs)]) == 2
    assert "validation.task" in capsys.readouterr().err


class FailsAfterFirstValidation(Hook):
    """A crash after epoch 1's rows are written, once: the run's last.pt is the interval
    save made at the same episode, before the epoch ended."""

    name = "fails_after_first_validation"
    failed = False

    def after_eval(self, run: RunView, section: str, values: dict[str, Any], partial: bool) -> None:
        if not FailsAfterFirstValidation.failed:
            FailsAfterFirstValidation.failed = True
            raise RuntimeError("crash after the epoch's rows")


def test_tensorboard_holds_no_row_twice_after_a_resume_from_an_epoch_s_last_step(
    tmp_path: Path,
) -> None:
    """checkpoint_interval 5 with 5 steps an epoch: last.pt is saved at episode 5, then the
    epoch's rows are written at episode 5. A run ended there and resumed wrote them again:
    TensorBoard purged from episode 6 on and kept both (the CSVs were right)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from torchloom.engine.setup import TrainOptions, prepare_training

    config = write(tmp_path, toy_config(epochs=2, checkpoint_interval=5))

    def run(*hooks: Hook, resume: Path | None = None) -> Any:
        options = TrainOptions(
            expdir=str(tmp_path / "runs"), quiet=True, tensorboard=1, hooks=hooks, device="cpu"
        )
        return prepare_training(None if resume else config, (), options, resume=resume).run()

    with pytest.raises(RuntimeError, match="crash after the epoch's rows"):
        run(FailsAfterFirstValidation())
    failed = only_run(tmp_path / "runs")
    assert summary(failed)["status"] == "failed"
    run(resume=failed)
    events = EventAccumulator(str(failed / "tensorboard"))
    events.Reload()
    assert [event.step for event in events.Scalars("training/epoch/loss")] == [5, 10]
    assert [event.step for event in events.Scalars("validation/epoch/loss")] == [5, 10]
    assert [event.step for event in events.Scalars("training/loss")] == [2, 4, 6, 8, 10]


def test_a_disk_that_fills_while_torch_writes_a_checkpoint_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's zip writer reports a write a full disk refused as its own RuntimeError ("unexpected
    pos"): the run ended in a traceback (exit 1) with that text as its reason."""
    from torchloom.engine import checkpoint

    def full_disk(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError(
            "[enforce fail at inline_container.cc:672] . unexpected pos 14976 vs 14928"
        )

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    target = tmp_path / "last.pt"
    with pytest.raises(StorageError, match="the disk is full") as raised:
        checkpoint.save_checkpoint(target, {"components": {}})
    assert str(target) in raised.value.format() and not target.exists()
    assert not list(tmp_path.iterdir())  # no temporary file left


def test_a_full_disk_when_the_run_s_lock_is_written_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock's record was written outside any guard: ENOSPC was a traceback (exit 1).
    (A full disk made by a link to /dev/full, which a run folder's link check would refuse
    first: that check is left out here.)"""
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    (tmp_path / ".lock").symlink_to("/dev/full")
    monkeypatch.setattr("torchloom.engine.run_lock.refuse_links", lambda folder: None)
    with pytest.raises(StorageError, match="cannot record the run's lock"):
        RunLock(tmp_path).acquire()


def test_a_user_error_in_a_loader_worker_is_said_as_the_worker_said_it_and_stops_it(
    tmp_path: Path,
) -> None:
    """torch builds a worker's error again from its traceback's text: the message was the
    whole traceback, under 'error:'. And the error kept the loader's iterator, whose workers
    (which leave stop signals to the run) outlived the run: `loom train` printed the error
    and never exited (its interpreter waited for them)."""
    import multiprocessing

    config = toy_config()
    config["training"]["task"]["type"] = "trust_components:FailsInLoaderWorkers"
    config["training"]["dataloader"]["num_workers"] = 1
    with pytest.raises(DataError) as raised:
        train(write(tmp_path, config), tmp_path / "runs")
    said = str(raised.value)
    assert said.startswith("data error: loader worker 0: sample ") and "Traceback" not in said
    assert said.endswith(": cannot be read: truncated file")
    assert not multiprocessing.active_children()
    assert summary(only_run(tmp_path / "runs"))["status"] == "failed"


def test_a_worker_error_that_cannot_be_pickled_still_reaches_the_run(tmp_path: Path) -> None:
    """Its class defined in a function: multiprocessing dropped the worker's error, and the
    run waited for the batch for ever. It arrives as a RuntimeError with the same text."""
    config = toy_config()
    config["training"]["task"]["type"] = "trust_components:FailsInLoaderWorkersWithItsOwnError"
    config["training"]["dataloader"]["num_workers"] = 1
    with pytest.raises(RuntimeError, match=r"ReaderCrashed: the reader of sample \d+ crashed"):
        train(write(tmp_path, config), tmp_path / "runs")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_second_ctrl_c_ends_a_run_whose_loader_worker_is_stuck_and_stops_the_worker(
    tmp_path: Path,
) -> None:
    """The first Ctrl-C asks for a stop at a step's end, which a batch that never comes never
    reaches; the second ends the run. The worker, which ignores SIGTERM, outlived it: the
    interpreter's exit then waited for it for ever."""
    import multiprocessing
    import signal
    import threading

    config = toy_config()
    config["training"]["task"]["type"] = "trust_components:StuckInLoaderWorkers"
    config["training"]["dataloader"]["num_workers"] = 1

    before = children(os.getpid())

    def press_ctrl_c_twice() -> None:
        # Once the loader worker started: the run is in its epoch, where it takes the
        # signals (earlier, Python's own handler would raise in whatever code ran).
        deadline = time.monotonic() + 120
        while children(os.getpid()) <= before and time.monotonic() < deadline:
            time.sleep(0.1)
        for _ in range(2):
            time.sleep(1.0)
            os.kill(os.getpid(), signal.SIGINT)

    presser = threading.Thread(target=press_ctrl_c_twice)
    presser.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            train(write(tmp_path, config), tmp_path / "runs")
    finally:
        presser.join()
    assert not multiprocessing.active_children()
