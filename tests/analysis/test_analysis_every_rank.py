"""Hooks that run in every process (Hook.every_rank) merge the processes' shares of a pass:
two ranks, played by two threads exchanging through a barrier, write the reports one process
writes, and a checkpoint taken by two resumes at one or two. (The real thing, two `loom train`
processes over gloo: tests/e2e/test_e2e_distributed.py.)"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from test_analysis_classification import fake_run as classification_run
from test_analysis_worst_samples import batch_of
from test_analysis_worst_samples import fake_run as worst_samples_run

from torchloom.analysis.classification import ClassificationAnalysis
from torchloom.analysis.embeddings import EmbeddingExport
from torchloom.analysis.prediction_errors import ErrorShare, merge_shares
from torchloom.analysis.schema import AnalysisConfig, EmbeddingsConfig, WorstSamplesConfig
from torchloom.analysis.worst_samples import WorstSamples
from torchloom.data.rank_shard import share
from torchloom.engine.distributed import SINGLE, Distributed


class Exchange:
    """What torch.distributed's all_gather_object does, for threads."""

    def __init__(self, world: int) -> None:
        self.slots: list[Any] = [None] * world
        self.barrier = threading.Barrier(world, timeout=10)


@dataclass(frozen=True)
class ThreadRank(Distributed):
    exchange: Exchange | None = None

    def gather(self, value: Any) -> list[Any]:
        assert self.exchange is not None
        self.exchange.slots[self.rank] = value
        self.exchange.barrier.wait()
        gathered = list(self.exchange.slots)
        self.exchange.barrier.wait()  # nobody writes the next value before all have read
        return gathered

    def broadcast(self, value: Any) -> Any:
        return self.gather(value)[0]


def as_ranks(world: int, work: Callable[[Distributed], Any]) -> list[Any]:
    """`work` run by `world` threads at once, one per rank; their results in rank order."""
    exchange, results, errors = Exchange(world), [None] * world, []

    def run(rank: int) -> None:
        try:
            results[rank] = work(ThreadRank(rank, world, rank, exchange))
        except BaseException as error:  # re-raised below, in the test
            errors.append(error)
            exchange.barrier.abort()

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def fake_run(folder: Path, distributed: Distributed) -> Any:
    folder.mkdir()
    return classification_run(folder, distributed)


def batches(count: int, size: int, last: int, seed: int) -> list[dict[str, Any]]:
    """Random scores of 3 classes, no sample ids (errors are numbered by position)."""
    generator = torch.Generator().manual_seed(seed)
    sizes = [size] * (count - 1) + [last]
    return [
        {
            "predictions": torch.randn(n, 3, generator=generator) * 2,
            "targets": torch.randint(0, 3, (n,), generator=generator),
        }
        for n in sizes
    ]


def shares_of(batch: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """A rank's share of a global batch: a contiguous slice, rank 0's first (RankShard)."""
    start, end = share(len(batch["targets"]), rank, world)
    return {key: value[start:end] for key, value in batch.items()}


def reports(folder: Path) -> dict[str, str]:
    files = sorted((folder / "reports").glob("*.*"))
    return {path.name: path.read_text() for path in files if path.suffix != ".png"}


def started_worst_samples(
    folder: Path, distributed: Distributed, config: AnalysisConfig | None = None
) -> tuple[Any, WorstSamples]:
    """A rank's run (its folder under `folder`, named by world and rank) and its worst-samples
    hook, started."""
    run = worst_samples_run(folder / f"w{distributed.world}-{distributed.rank}")
    run.run_dir.mkdir()
    run.distributed = distributed
    hook = WorstSamples(config or AnalysisConfig())
    hook.before_train(run)
    return run, hook


# Two training steps of 4 samples, each shared among the ranks.
TRAINING_STEPS = [batch_of(ids, seed=step) for step, ids in enumerate(([3, 1, 4, 0], [9, 2, 6, 8]))]


def test_merged_error_rows_are_in_the_order_one_process_writes_them() -> None:
    # Two batches of 5 (3 + 2), then a last batch of 1 that rank 1 has no share of.
    rank0 = ErrorShare(rows=[(0, 2, None, 1, 0, 0.5), (2, 0, None, 2, 1, 0.7)], sizes=[3, 3, 1])
    rank1 = ErrorShare(rows=[(0, 0, None, 0, 2, 0.6), (1, 1, None, 1, 2, 0.9)], sizes=[2, 2])
    assert merge_shares([rank0, rank1]) == [
        (2, 1, 0, 0.5),  # batch 0: rank 0's samples 0-2 first, then rank 1's 3-4
        (3, 0, 2, 0.6),
        (9, 1, 2, 0.9),  # batch 1: positions 5-7 rank 0's, 8-9 rank 1's
        (10, 2, 1, 0.7),  # batch 2: position 10
    ]
    # With ids, the ids; a process that had no batch of the pass adds nothing.
    with_ids = ErrorShare(rows=[(0, 1, 41, 1, 0, 0.5)], sizes=[2])
    assert merge_shares([with_ids, None]) == [(41, 1, 0, 0.5)]


def test_two_ranks_write_the_reports_one_process_writes(tmp_path: Path) -> None:
    training, validation = batches(6, 8, 5, seed=1), batches(3, 8, 3, seed=2)
    config = AnalysisConfig()

    def one_pass_each(hook: ClassificationAnalysis, run: Any, rank: int, world: int) -> None:
        for batch in training:
            hook.after_step(run, shares_of(batch, rank, world), torch.tensor(0.0))
        hook.after_training_epoch(run, {})
        for batch in validation:
            hook.eval_batch(run, "validation", shares_of(batch, rank, world))
        hook.after_eval(run, "validation", {}, partial=False)

    one = ClassificationAnalysis(config)
    alone = fake_run(tmp_path / "one", SINGLE)
    one.before_train(alone)
    one_pass_each(one, alone, 0, 1)

    def two(distributed: Distributed) -> None:
        hook, rank = ClassificationAnalysis(config), distributed.rank
        run = fake_run(tmp_path / f"rank{rank}", distributed)
        hook.before_train(run)
        one_pass_each(hook, run, rank, 2)

    as_ranks(2, two)
    expected = reports(tmp_path / "one")
    assert "predictions-validation-errors.csv" in expected and len(expected) == 6
    assert reports(tmp_path / "rank0") == expected
    assert not (tmp_path / "rank1" / "reports").exists()  # rank 0 alone writes


def test_a_checkpoint_of_two_ranks_resumes_at_one_or_two(tmp_path: Path) -> None:
    training = batches(6, 8, 5, seed=3)
    config = AnalysisConfig()
    one = ClassificationAnalysis(config)
    alone = fake_run(tmp_path / "one", SINGLE)
    one.before_train(alone)
    for batch in training:
        one.after_step(alone, batch, torch.tensor(0.0))
    one.after_training_epoch(alone, {})

    def first_half(distributed: Distributed) -> dict[str, Any]:
        hook, rank = ClassificationAnalysis(config), distributed.rank
        run = fake_run(tmp_path / f"rank{rank}", distributed)
        hook.before_train(run)
        for batch in training[:3]:
            hook.after_step(run, shares_of(batch, rank, 2), torch.tensor(0.0))
        return hook.state_dict()  # the counts of both, in each

    saved, _ = as_ranks(2, first_half)

    def second_half(distributed: Distributed) -> None:
        hook, rank, world = ClassificationAnalysis(config), distributed.rank, distributed.world
        hook.load_state_dict(saved)  # every process reads last.pt; one adds its counts
        run = fake_run(tmp_path / f"resumed{world}-{rank}", distributed)
        hook.before_train(run)
        for batch in training[3:]:
            hook.after_step(run, shares_of(batch, rank, world), torch.tensor(0.0))
        hook.after_training_epoch(run, {})

    for world in (1, 2):
        if world == 1:
            second_half(SINGLE)
        else:
            as_ranks(world, second_half)
        assert reports(tmp_path / f"resumed{world}-0") == reports(tmp_path / "one"), world


def test_worst_samples_of_two_ranks_are_those_of_one(tmp_path: Path) -> None:
    """Validation passes of which rank 1 has a smaller share, or none: each rank ends with
    the history one process holds, and rank 0 writes its report."""
    config = AnalysisConfig(worst_samples=WorstSamplesConfig(section="validation", count=4))
    # The second pass has one sample: rank 1 has no batch of it at all.
    ids = [([3, 1, 4, 0, 5], [9, 2, 6], [8]), ([7],)]
    passes = [[batch_of(some, seed=epoch) for some in ids[epoch]] for epoch in (0, 1)]

    def validate(distributed: Distributed) -> torch.Tensor:
        rank, world = distributed.rank, distributed.world
        run, hook = started_worst_samples(tmp_path, distributed, config)
        for epoch, batches in enumerate(passes):
            for batch in batches:
                mine = shares_of(batch, rank, world)
                if len(mine["targets"]):
                    hook.eval_batch(run, "validation", mine)
            run.progress.epoch = epoch + 1
            hook.after_eval(run, "validation", {}, partial=False)
        hook.after_train(run, {})
        return hook.trackers[0].history

    alone = validate(SINGLE)
    for history in as_ranks(2, validate):
        assert torch.equal(history.isnan(), alone.isnan())
        assert torch.equal(history.nan_to_num(), alone.nan_to_num())
    worst = "reports/worst_samples/worst.csv"
    assert (tmp_path / "w2-0" / worst).read_text() == (tmp_path / "w1-0" / worst).read_text()
    assert not (tmp_path / "w2-1" / "reports").exists()


def test_embeddings_of_two_ranks_are_the_points_one_process_exports() -> None:
    """The first `max_samples` rows of a pass, in the order one process meets them, though
    each rank kept the first of its own share; rank 1 has no TensorBoard writer and follows
    rank 0's decision to export."""
    generator = torch.Generator().manual_seed(4)
    passes = [
        {"z": torch.randn(n, 3, generator=generator), "targets": torch.arange(n) % 3}
        for n in (4, 4, 3)
    ]
    config = AnalysisConfig(embeddings=EmbeddingsConfig(streams=["z"], max_samples=7))

    def export(distributed: Distributed) -> Any:
        rank, world = distributed.rank, distributed.world
        run = SimpleNamespace(
            tensorboard=object() if rank == 0 else None,  # rank 0's alone
            validation_data=object(),
            log=logging.getLogger("test.embeddings"),
            distributed=distributed,
        )
        hook = EmbeddingExport(config)
        hook.before_train(run)
        for batch in passes:
            hook.eval_batch(run, "validation", shares_of(batch, rank, world))
        hook.after_eval(run, "validation", {}, partial=False)
        return hook.final

    alone = export(SINGLE)
    merged, other = as_ranks(2, export)
    assert other is None and alone.rows == merged.rows == 7
    assert torch.equal(merged.joined("z"), alone.joined("z"))
    targets = [torch.cat([p.targets for p in kept.parts]) for kept in (merged, alone)]
    assert torch.equal(*targets)


def test_worst_samples_of_an_epoch_cut_short_are_those_of_one(tmp_path: Path) -> None:
    """A run that diverges mid-epoch goes from its last step to after_train, with neither the
    epoch's end nor a checkpoint: the losses of the epoch so far are still every rank's."""

    def train(distributed: Distributed) -> None:
        run, hook = started_worst_samples(tmp_path, distributed)
        for batch in TRAINING_STEPS:
            hook.after_step(
                run, shares_of(batch, distributed.rank, distributed.world), torch.tensor(0.0)
            )
        hook.after_train(run, {})

    train(SINGLE)
    as_ranks(2, train)
    worst = "reports/worst_samples/worst.csv"
    expected = (tmp_path / "w1-0" / worst).read_text()
    assert len(expected.splitlines()) == 1 + 8  # every sample of both steps
    assert (tmp_path / "w2-0" / worst).read_text() == expected


def test_the_training_row_is_exchanged_once_for_an_epoch_s_end_and_its_checkpoints(
    tmp_path: Path,
) -> None:
    """The epoch's end, then last.pt and best.pt: the row is every rank's after the first
    exchange, so the checkpoints send nothing; a step after them needs one again."""
    exchanges: dict[int, list[int]] = {}

    def train(distributed: Distributed) -> None:
        assert isinstance(distributed, ThreadRank)
        rank, world = distributed.rank, distributed.world
        counting = CountingRank(rank, world, rank, distributed.exchange)
        run, hook = started_worst_samples(tmp_path, counting)
        for batch in TRAINING_STEPS:
            hook.after_step(run, shares_of(batch, rank, world), torch.tensor(0.0))
        hook.after_training_epoch(run, {})
        after_epoch = counting.calls[0]
        hook.state_dict()  # last.pt
        hook.state_dict()  # best.pt
        after_checkpoints = counting.calls[0]
        hook.after_step(run, shares_of(TRAINING_STEPS[0], rank, world), torch.tensor(0.0))
        hook.state_dict()
        exchanges[rank] = [after_epoch, after_checkpoints, counting.calls[0]]

    as_ranks(2, train)
    (once, _, _) = exchanges[0]
    assert once > 0
    assert exchanges == {rank: [once, once, 2 * once] for rank in (0, 1)}


@dataclass(frozen=True)
class CountingRank(ThreadRank):
    calls: list[int] = field(default_factory=lambda: [0])

    def gather(self, value: Any) -> list[Any]:
        self.calls[0] += 1
        return super().gather(value)
