"""Toy components that misbehave on purpose, for the tests of how runs end and resume
(`trust_components:Class` in a config, as a third-party component would be named)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field

from torchloom.core.component import Batch, BuildContext, Component, ComponentParams, Statistic
from torchloom.core.streams import Dim, StreamSpec
from torchloom.errors import ConfigError, DataError
from toy_components import ToyLinear, ToyTask


class AtStep(Component):
    """Reads `inputs`; `act(step)` at each training call (numbered from 1) in the worker of
    global rank `rank` of several processes (every worker: None)."""

    class Params(ComponentParams):
        at: int = Field(3, gt=0)
        rank: int | None = None

    def __init__(self, params: Any, context: BuildContext) -> None:
        super().__init__(params, context)
        self.calls = 0

    def input_specs(self) -> dict[str, StreamSpec]:
        return {"inputs": StreamSpec(None, None, "anything")}

    def forward(self, inputs: Batch) -> Batch:
        mine = self.params.rank is None or os.environ.get("RANK") == str(self.params.rank)
        if self.training and mine:
            self.calls += 1
            self.act(self.calls)
        return {}

    def act(self, step: int) -> None:
        raise NotImplementedError


class FailsAtStep(AtStep):
    """Raises RuntimeError on its `at`-th training call: a component bug (`user_error`: a
    ConfigError instead)."""

    class Params(AtStep.Params):
        user_error: bool = False

    def act(self, step: int) -> None:
        if step != self.params.at:
            return
        if self.params.user_error:
            raise ConfigError.at("toy component", "pipeline.fails", f"refuses step {step}")
        raise RuntimeError(f"boom at step {step}\nsecond line of the message")


class DeafAfterStep(AtStep):
    """From its `at`-th training call on, ignores SIGINT, SIGTERM and SIGHUP and sleeps
    `seconds` a step: a process that never sees a signal, as one waiting inside a
    collective does not."""

    class Params(AtStep.Params):
        at: int = Field(2, gt=0)
        seconds: float = 0.5

    def act(self, step: int) -> None:
        if step >= self.params.at:
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(signum, signal.SIG_IGN)
            time.sleep(self.params.seconds)


class SlowInEvaluation(Component):
    """Sleeps `seconds` per batch of an evaluation pass (validation, test), or with
    `in_training` per training step: a window in which a test can stop the process."""

    class Params(ComponentParams):
        seconds: float = Field(0.2, ge=0)
        in_training: bool = False

    def input_specs(self) -> dict[str, StreamSpec]:
        return {"inputs": StreamSpec(None, None, "anything")}

    def forward(self, inputs: Batch) -> Batch:
        if self.training == self.params.in_training:
            time.sleep(self.params.seconds)
        return {}


class SwallowsInterrupts(Component):
    """Built slowly (`seconds`, after touching a file named after its process in the folder
    `markers`), as torch's modules are imported, and turns a Ctrl-C that comes meanwhile
    into an ImportError that names no interrupt: what a module whose import a signal cut
    short says to every later import of it. With `when_env`, only in processes that have
    that environment variable (a search's worker processes: the search's own checks build
    the pipeline too)."""

    class Params(ComponentParams):
        markers: str  # a folder
        seconds: float = Field(20.0, gt=0)
        when_env: str | None = None

    def __init__(self, params: Any, context: BuildContext) -> None:
        super().__init__(params, context)
        if self.params.when_env is not None and self.params.when_env not in os.environ:
            return
        (Path(self.params.markers) / str(os.getpid())).touch()
        interrupted = False
        try:
            time.sleep(self.params.seconds)
        except KeyboardInterrupt:
            interrupted = True
        if interrupted:
            raise ImportError("cannot import name '_inductor' from 'torch'")

    def input_specs(self) -> dict[str, StreamSpec]:
        return {"inputs": StreamSpec(None, None, "anything")}

    def forward(self, inputs: Batch) -> Batch:
        return {}


class WrongKeyModel(ToyLinear):
    """Declares `predictions` but returns `preds`: a plugin bug the first batch must name."""

    def forward(self, inputs: Batch) -> Batch:
        return {"preds": super().forward(inputs)["predictions"]}


class TooManyClasses(ToyLinear):
    """Declares `classes` outputs but returns two more."""

    def forward(self, inputs: Batch) -> Batch:
        predictions = super().forward(inputs)["predictions"]
        return {"predictions": F.pad(predictions, (0, 2))}


class FlatPredictions(ToyLinear):
    """Declares [batch, classes] but returns the scores flattened to one dimension."""

    def forward(self, inputs: Batch) -> Batch:
        return {"predictions": super().forward(inputs)["predictions"].flatten()}


class IntegerPredictions(ToyLinear):
    """Declares floating-point scores but returns class indices as int64 of the same shape."""

    def forward(self, inputs: Batch) -> Batch:
        predictions = super().forward(inputs)["predictions"]
        return {"predictions": predictions.round().to(torch.int64)}


class WideLinear(ToyLinear):
    """A ToyLinear whose hidden layer width differs: another model's checkpoint."""

    def __init__(self, params: Any, context: BuildContext) -> None:
        super().__init__(params, context)
        self.linear = torch.nn.Linear(self.width + 1, self.classes)

    def forward(self, inputs: Batch) -> Batch:
        padded = F.pad(inputs["inputs"], (0, 1))
        return {"predictions": F.log_softmax(self.linear(padded), -1)}

    def output_specs(self) -> dict[str, StreamSpec]:
        return {"predictions": StreamSpec(("batch", Dim("classes", self.classes)), None, "")}


class SampleCounter(Statistic):
    """Counts the samples it was given since its last reset: `seen`."""

    def __init__(self, params: Any, context: BuildContext) -> None:
        super().__init__(params, context)
        self.register_buffer("seen", torch.zeros((), dtype=torch.int64))

    def input_specs(self) -> dict[str, StreamSpec]:
        return {"targets": StreamSpec(("batch",), None, "one per sample")}

    def update(self, inputs: Batch) -> None:
        self.seen += len(inputs["targets"])

    def compute(self) -> dict[str, float]:
        return {"seen": float(self.seen)}

    def reset(self) -> None:
        self.seen.zero_()


class NanAtStep(Component):
    """Turns its input into NaN on its `at`-th training call: a loss that diverges."""

    class Params(ComponentParams):
        at: int = Field(3, gt=0)

    def __init__(self, params: Any, context: BuildContext) -> None:
        super().__init__(params, context)
        self.calls = 0

    def input_specs(self) -> dict[str, StreamSpec]:
        return {"inputs": StreamSpec(("batch", -1), None, "vectors")}

    def output_specs(self) -> dict[str, StreamSpec]:
        return {"noisy": StreamSpec(("batch", -1), None, "the vectors, or NaN")}

    def forward(self, inputs: Batch) -> Batch:
        if self.training:
            self.calls += 1
            if self.calls == self.params.at:
                return {"noisy": inputs["inputs"] * float("nan")}
        return {"noisy": inputs["inputs"]}


class CountsCalls(Component):
    """Reads any stream and counts its calls, in training and in evaluation passes apart:
    the base of the components below, which act at a given call (`act`)."""

    def __init__(self, params: Any, context: BuildContext) -> None:
        super().__init__(params, context)
        self.calls = {True: 0, False: 0}  # by self.training

    def input_specs(self) -> dict[str, StreamSpec]:
        return {"inputs": StreamSpec(None, None, "anything")}

    def forward(self, inputs: Batch) -> Batch:
        self.calls[self.training] += 1
        self.act(self.calls[self.training])
        return {}

    def act(self, call: int) -> None:
        raise NotImplementedError

    def in_rank(self, rank: int) -> bool:
        return os.environ.get("RANK") == str(rank)


class DiesOnce(CountsCalls):
    """Kills its own process (SIGKILL) on its `at`-th training call, in the worker of global
    rank `rank` and only in the first attempt of an elastic launch: a worker that dies."""

    class Params(ComponentParams):
        at: int = Field(4, gt=0)
        rank: int = Field(1, ge=0)

    def act(self, call: int) -> None:
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        at = self.training and call == self.params.at
        if at and first_attempt and self.in_rank(self.params.rank):
            os.kill(os.getpid(), signal.SIGKILL)


class HeldInEvaluation(CountsCalls):
    """Waits in an evaluation pass while the file `marker` exists (60 s at most), from its
    `from_call`-th evaluation call on: a test signals the process in the pass, then removes
    the file, however slow the machine."""

    class Params(ComponentParams):
        marker: str
        from_call: int = Field(1, gt=0)

    def act(self, call: int) -> None:
        deadline = time.monotonic() + 60
        held = not self.training and call >= self.params.from_call
        while held and os.path.exists(self.params.marker) and time.monotonic() < deadline:
            time.sleep(0.02)


class SignalsInEvaluation(CountsCalls):
    """Sends SIGTERM to its own process at its `at`-th call in an evaluation pass, in the
    worker of global rank `rank` alone: a stop that reaches one process of several."""

    class Params(ComponentParams):
        at: int = Field(1, gt=0)
        rank: int = Field(1, ge=0)

    def act(self, call: int) -> None:
        if not self.training and call == self.params.at and self.in_rank(self.params.rank):
            os.kill(os.getpid(), signal.SIGTERM)


class PutsInPlace(ToyLinear):
    """A ToyLinear whose forward also calls `put_`, which torch has no deterministic version
    of on any device: a component that `training.deterministic` cannot run."""

    def forward(self, inputs: Batch) -> Batch:
        torch.zeros(3).put_(torch.tensor([1]), torch.tensor([2.0]))
        return super().forward(inputs)


class TerminatedLoader(ToyTask):
    """A task whose loader fails on its `at`-th batch, as a loader whose workers a SIGTERM
    sent to the whole process group killed: the run's process gets the signal too, first."""

    class Params(ToyTask.Params):
        at: int = Field(3, gt=0)

    def __init__(self, params: Any, context: BuildContext) -> None:
        super().__init__(params, context)
        self.fetches = 0

    def fetch(self, indices: Any) -> Batch:
        self.fetches += 1
        if self.fetches == self.params.at:
            os.kill(os.getpid(), signal.SIGTERM)  # handled at once, in this (the main) thread
            raise RuntimeError("DataLoader worker (pid 1) is killed by signal: Terminated.")
        return super().fetch(indices)


class SlowSamples(ToyTask):
    """A task whose every sample takes `delay` seconds to make (a slow augmentation)."""

    class Params(ToyTask.Params):
        delay: float = Field(0.5, gt=0)

    def __getitem__(self, index: int) -> Batch:
        time.sleep(self.params.delay)
        return super().__getitem__(index)


class AllocatesAtBuild(Component):
    """Allocates `size` bytes as it is built: a config asking for more than the machine has."""

    class Params(ComponentParams):
        size: int = Field(ge=1)

    def __init__(self, params: Any, context: BuildContext) -> None:
        super().__init__(params, context)
        self.block = torch.empty(params.size, dtype=torch.uint8)

    def input_specs(self) -> dict[str, StreamSpec]:
        return {"inputs": StreamSpec(None, None, "anything")}

    def forward(self, inputs: Batch) -> Batch:
        return {}


class FailsInLoaderWorkers(ToyTask):
    """A task whose samples cannot be read in a loader worker (a user error, as a truncated
    file is); in the run's own process they can (the handshake's sample)."""

    def __getitem__(self, index: int) -> Batch:
        from torch.utils.data import get_worker_info

        if get_worker_info() is not None:
            raise DataError.at("", f"sample {index}", "cannot be read: truncated file")
        return super().__getitem__(index)


class _HeldCamera(str):
    """A label that holds something pickle cannot copy (an open device, a lock)."""

    def __reduce__(self) -> Any:
        raise TypeError("cannot pickle '_HeldCamera' object: it holds an open camera")


class UnsendableSamples(ToyTask):
    """A task whose samples' labels cannot be pickled: fine in the run's process, lost on
    the way from a loader worker."""

    def __getitem__(self, index: int) -> Batch:
        sample = super().__getitem__(index)
        sample["labels"] = _HeldCamera(sample["labels"])
        return sample


class FailsInLoaderWorkersWithItsOwnError(ToyTask):
    """A task whose worker raises an error of a class defined in a function, which pickle
    cannot name: the worker's error itself could not be handed over."""

    def __getitem__(self, index: int) -> Batch:
        from torch.utils.data import get_worker_info

        class ReaderCrashed(Exception):
            pass

        if get_worker_info() is not None:
            raise ReaderCrashed(f"the reader of sample {index} crashed")
        return super().__getitem__(index)


class StuckInLoaderWorkers(ToyTask):
    """A task whose loader workers never finish a sample (a read that never returns)."""

    def __getitem__(self, index: int) -> Batch:
        from torch.utils.data import get_worker_info

        if get_worker_info() is not None:
            time.sleep(3600)
        return super().__getitem__(index)
