"""One process's share of every global batch of an epoch sampler, when several processes
train one run (`loom train --nproc N`, several machines): what DistributedSampler does, but
cutting each global batch rather than the whole epoch, so that the processes together see the
batches one process would see, with nothing padded or repeated."""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import Sampler

from torchloom.data.samplers import ResumableSampler


def share(count: int, rank: int, world: int) -> tuple[int, int]:
    """[start, end) of `rank`'s share of `count` items split as evenly as possible (the first
    `count % world` ranks get one more)."""
    base, extra = divmod(count, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


class RankShard(Sampler[int]):
    """One process's share of every global batch of a sampler (several processes training one
    run): global batch k of the epoch's order, cut in `world` even parts, gives this rank its
    part. So the processes together see exactly the batches one process would see, whatever
    their number; no index is repeated or padded. Positions (`set_start`) stay global."""

    def __init__(
        self, sampler: ResumableSampler, batch_size: int, rank: int, world: int, drop_last: bool
    ) -> None:
        super().__init__()
        self.sampler, self.batch_size, self.rank, self.world = sampler, batch_size, rank, world
        self.drop_last = drop_last

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def set_start(self, position: int) -> None:
        self.sampler.set_start(position)

    def epoch_length(self) -> int:
        return self.sampler.epoch_length()

    def _chunks(self) -> Iterator[tuple[int, list[int]]]:
        """(global position of its first, indices) of this rank's part of each batch."""
        sampler = self.sampler
        order = sampler._order(sampler.epoch)[sampler.start :]  # one tensor, not ints
        for first in range(0, len(order), self.batch_size):
            chunk = order[first : first + self.batch_size]
            if self.drop_last and len(chunk) < self.batch_size:
                return
            start, end = share(len(chunk), self.rank, self.world)
            yield sampler.start + first + start, chunk[start:end].tolist()

    def __iter__(self) -> Iterator[int]:
        for _, chunk in self._chunks():
            yield from chunk

    def positioned(self) -> Iterator[tuple[int, int]]:
        """(position in the global epoch order, index) of each index `__iter__` gives."""
        for position, chunk in self._chunks():
            yield from enumerate(chunk, start=position)

    def __len__(self) -> int:
        remaining = len(self.sampler)
        full, last = divmod(remaining, self.batch_size)
        mine = full * share(self.batch_size, self.rank, self.world)[1]
        mine -= full * share(self.batch_size, self.rank, self.world)[0]
        if last and not self.drop_last:
            start, end = share(last, self.rank, self.world)
            mine += end - start
        return mine
