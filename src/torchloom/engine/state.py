"""What a training run holds, split by how it changes, and what hooks see of it.

- `RunSetup`: what set-up built and what does not change while the run goes: the pipeline,
  loaders, optimizer, scheduler, precision, loss, reporter, run folder, log, hooks.
- `Progress`: where the run is: completed epochs, episodes, the position in the epoch.
- `LoopMeters` (engine/loop_state.py): the loop's running losses, statistics and latest
  values; the loop (`TrainingLoop`, engine/trainer.py) saves and restores all three through
  engine/loop_state.py.

Hooks observe a run through `RunView`, a few documented attributes (as detectron2's
`HookBase` sees a few attributes of its trainer), never the loop's internals. A hook never
changes training (with compiled models, a step a hook asks to see eagerly computes the same
thing with eager kernels, rounded as those round); it may ask the run to stop, as Ctrl-C
does. The loop calls, in order:

    before_train(run)
    per training batch:   needs_eager_step(run)             only when models are compiled
                          after_step(run, batch, loss)      cheap: no host sync, O(1) memory
    at logging intervals: after_interval(run)
    after each epoch:     after_training_epoch(run, values)
    evaluation passes:    eval_batch(run, section, batch)   every batch of validation / test
                          after_eval(run, section, values, partial)
    after_train(run, summary)
    release()                                               however the run ended (also
                                                            after an exception): close files,
                                                            remove hooks on modules

Hooks that keep state across epochs (a worst-samples history) save it with `state_dict()`
into checkpoints, so a resumed run continues it. The engine never imports the analysis
package: whoever starts a run (the CLI, the Python API) builds the hooks and hands them over.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import torch

from torchloom.config.schema import TrainingConfig, ValidationConfig
from torchloom.core.component import Batch
from torchloom.core.pipeline import Pipeline
from torchloom.engine.architecture_search import ArchitectureSearch
from torchloom.engine.distributed import SINGLE, Distributed
from torchloom.engine.loaders import SectionLoader
from torchloom.engine.reporting import Reporter
from torchloom.engine.run_folder import Status
from torchloom.engine.run_lock import NoLock, RunLock
from torchloom.engine.step import DivergenceGuard, Precision, WeightedLoss
from torchloom.engine.terminal import Monitor
from torchloom.errors import Where
from torchloom.signals import record_stop, terminating_signals


class StopSignals:
    """Whether the run was asked to stop at the end of its step or epoch, where its state is
    consistent (last.pt saved, the summary written): by Ctrl-C, SIGTERM or SIGHUP (unless
    ignored: torchloom/signals.py), a second one of which stops it at once, or by a hook with
    its reason (a search's pruner)."""

    def __init__(self) -> None:
        self.requested = False
        self.reason: str | None = None  # a hook's; None for a signal
        self._previous: dict[int, Any] = {}

    def stop(self, reason: str | None = None) -> None:
        """Stop as a signal does (no reason), or for a hook's reason; a signal's stop stays."""
        if not self.by_signal:
            self.requested, self.reason = True, reason

    @property
    def by_signal(self) -> bool:
        """A signal's request: it also stops the final test pass, which a hook's, come too
        late to stop the training, does not (the run then ends at its limit as it would)."""
        return self.requested and self.reason is None

    @property
    def status(self) -> Status:
        """How a run that stops on this request ends."""
        return Status.INTERRUPTED if self.reason is None else Status.STOPPED

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        record_stop(signum)
        if self.by_signal:  # a second signal; a hook's stop before it was no signal
            raise KeyboardInterrupt
        self.stop()

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, *terminating_signals()):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()


@dataclass
class TrainOptions:
    """How to run (not what to train): where, on which device, how loud."""

    expdir: str = "runs"
    tag: str = ""
    device: str | None = None
    quiet: bool = False
    tensorboard: int = 1
    disable: Sequence[str] = ()
    hooks: Sequence[Hook] = ()
    # Builds more hooks from the loaded config and the built pipeline (the analysis section);
    # given by the caller, so the engine never imports the analysis package.
    hook_factory: Callable[[Mapping[str, Any], Pipeline, Where], Sequence[Hook]] | (None) = None


@dataclass
class Progress:
    epoch: int = 0  # completed epochs
    episode: int = 0  # batches trained on
    batch_in_epoch: int = 0
    wall_time: float = 0.0  # seconds spent in earlier sessions of this run (resumed ones)
    # False when a stop came between a step and its after-step work (a partial validation, a
    # save, the episode limit): a resumed run does that work first (TrainingLoop.after_step).
    step_settled: bool = True
    # The end the last judged evaluation gave ("converged", "early_stopped"; "" to go on): a
    # run stopped after it, in its final test pass, resumes to that end (terminal.resumed_end).
    judged: str = ""

    @property
    def row_epoch(self) -> int:
        """The epoch a row of figures belongs to, numbered from 1: the epoch in progress when
        it is measured mid-epoch (a partial validation, a run stopped at its episode limit),
        else the one just completed."""
        return self.epoch + 1 if self.batch_in_epoch else self.epoch

    def state_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)


def evaluated_epoch(progress: Mapping[str, Any] | None) -> int:
    """The epoch whose data an evaluation at a checkpoint's point visited (its sampler's epoch:
    k-fold's held-out fold rotates with it): the epoch in progress for a save mid-epoch (an
    online partial validation), else the one just completed; 0 without a checkpoint."""
    if not progress:
        return 0
    epoch, inside = int(progress.get("epoch", 0)), int(progress.get("batch_in_epoch", 0))
    return epoch if inside else max(epoch - 1, 0)


@dataclass
class RunSetup:
    """Everything set-up built for one run (engine/setup.py); fixed while it trains."""

    name: str
    config: TrainingConfig
    validation_config: ValidationConfig | None
    run_dir: Path
    config_text: str  # config.yaml as the run started: checkpoints keep it (engine/resume.py)
    device: torch.device
    seed: int
    pipeline: Pipeline
    train_data: SectionLoader
    validation_data: SectionLoader | None
    test_data: SectionLoader | None
    optimizer: torch.optim.Optimizer
    scheduler: Any  # a torch LRScheduler, or None
    precision: Precision
    loss: WeightedLoss
    guard: DivergenceGuard
    monitor: Monitor
    reporter: Reporter
    log: logging.Logger
    lock: RunLock | NoLock  # held while this process trains in run_dir (rank 0's alone)
    signals: StopSignals = field(default_factory=StopSignals)
    hooks: Hooks = field(default_factory=lambda: Hooks())
    compiled_models: list[str] = field(default_factory=list)  # by `training.compile`
    show_progress: bool = True
    distributed: Distributed = SINGLE  # this process among those training the run
    architecture_search: ArchitectureSearch | None = None  # training.architecture_search
    # The config as written, its `${...}` unresolved (YAML runs): checkpoints keep it, so that
    # a resume sees what its overrides change through an interpolation (engine/resume.py).
    config_written: str | None = None

    @property
    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for g in self.optimizer.param_groups for p in g["params"] if p.requires_grad]

    @property
    def sharded(self) -> bool:
        """Whether last.pt's weights and optimizer states are saved as shards (FSDP)."""
        return self.config.distributed.strategy == "fsdp"

    @property
    def accumulation(self) -> int:
        return self.config.gradient_accumulation

    @property
    def scheduler_interval(self) -> str:
        return self.config.scheduler.interval if self.config.scheduler else "epoch"

    @property
    def online(self) -> bool:
        return self.config.mode == "online"

    @property
    def partial_interval(self) -> int:
        assert self.validation_config is not None
        return self.validation_config.partial_validation_interval or self.config.logging_interval

    @property
    def partial_batches(self) -> int:
        assert self.validation_config is not None
        return self.validation_config.partial_validation_batches


class RunView:
    """What a hook sees of a run: read these, and change nothing through them.

    name, run_dir, log:   the pipeline's name, the run folder, the run's logger (run.log)
    pipeline, device:     the components (in execution order), where they run
    seed:                 the run's seed (a hook that samples draws from its own generator)
    optimizer, precision: the optimizer (its param groups' rates) and the precision (autocast,
                          the fp16 GradScaler) the step uses
    compiled_models:      names of the models `training.compile` compiled
    sharded_models:       whether the models are sharded among processes (FSDP): then a
                          forward pass or whole weights need every process, not a hook alone
    train_data, validation_data: the sections' loaders (their tasks, one batch to look at)
    online, logging_interval: the config's validation mode and interval
    progress:             completed epochs, episodes, position in the epoch (live)
    tensorboard:          the run's SummaryWriter, or None when TensorBoard is off
    distributed:          this process among those training the run (rank, world, the
                          collectives a hook that runs in every process merges with)
    request_stop(reason): stop at the end of this step or epoch (from before_train: before
                          the first step); with a reason (a search's pruner) the run ends
                          `stopped` with it, without one `interrupted`, as Ctrl-C does
    """

    def __init__(self, setup: RunSetup, progress: Progress) -> None:
        self._setup = setup
        self.progress = progress
        self.name, self.run_dir, self.log = setup.name, setup.run_dir, setup.log
        self.pipeline, self.device, self.seed = setup.pipeline, setup.device, setup.seed
        self.optimizer, self.precision = setup.optimizer, setup.precision
        self.compiled_models = list(setup.compiled_models)
        self.train_data, self.validation_data = setup.train_data, setup.validation_data
        self.online, self.logging_interval = setup.online, setup.config.logging_interval
        # FSDP with several processes: a model's forward is a collective, so nothing may run
        # one on rank 0 alone (where most hooks run only).
        self.sharded_models = setup.sharded and setup.distributed.active
        self.distributed = setup.distributed

    @property
    def tensorboard(self) -> Any:
        return self._setup.reporter.writer

    def request_stop(self, reason: str | None = None) -> None:
        self._setup.signals.stop(reason)


class Hook:
    """Base class: override the events you need. `name` keys its checkpoint state.

    With several processes a hook runs in rank 0 alone, which sees 1/N of every batch. A hook
    about every sample of a pass (a confusion matrix, per-sample losses) sets `every_rank`:
    it then runs in every process, each seeing its share, and merges the shares through
    `run.distributed` at a pass's end and in `state_dict` (collectives: every process calls
    them, at the same events, whatever data it had); rank 0 alone writes files."""

    name = "hook"
    every_rank = False

    def before_train(self, run: RunView) -> None: ...

    def needs_eager_step(self, run: RunView) -> bool:
        """Whether the coming training step must run compiled models eagerly: torch.compile
        neither calls nor notices forward hooks registered on a compiled model's layers after
        it compiled, so a hook that observes a step through them asks for this."""
        return False

    def after_step(self, run: RunView, batch: Batch, loss: torch.Tensor) -> None: ...

    def after_interval(self, run: RunView) -> None: ...

    def after_training_epoch(self, run: RunView, values: dict[str, Any]) -> None: ...

    def eval_batch(self, run: RunView, section: str, batch: Batch) -> None: ...

    def after_eval(
        self, run: RunView, section: str, values: dict[str, Any], partial: bool
    ) -> None: ...

    def after_train(self, run: RunView, summary: dict[str, Any]) -> None: ...

    def release(self) -> None:
        """Let go of what the hook holds (files being written, hooks on modules) however the
        run ended: after after_train, or in its place when an exception ended the run."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Hooks:
    """The hooks of one run, called in the order given. `seconds` adds up the time spent in
    them per event, so a run can say what its analysis cost (and a benchmark can measure it
    directly, not only as the difference of two noisy wall times)."""

    def __init__(self, hooks: Sequence[Hook] = ()) -> None:
        self.hooks = list(hooks)
        self.seconds: dict[str, float] = {}
        self.in_training = 0.0  # seconds in hooks until the training loop ended

    def __bool__(self) -> bool:
        return bool(self.hooks)

    def _call(self, event: str, *args: Any) -> None:
        if not self.hooks:
            return
        started = time.perf_counter()
        for hook in self.hooks:
            getattr(hook, event)(*args)
        self.seconds[event] = self.seconds.get(event, 0.0) + time.perf_counter() - started

    def total(self) -> float:
        """Seconds spent in the hooks so far."""
        return sum(self.seconds.values())

    def training_ended(self) -> None:
        """Mark the end of the training loop: what the hooks cost from here on (the test
        pass, the final plots) is paid once per run, not per epoch."""
        self.in_training = self.total()

    def cost(self, training_seconds: float) -> str:
        """What the hooks cost the run, said at its end."""
        spent, after = self.in_training, self.total() - self.in_training
        share = 100 * spent / max(training_seconds, 1e-9)
        return (
            f"analysis took {spent:.1f} s of the {training_seconds:.1f} s of training "
            f"({share:.1f}%), and {after:.1f} s after it"
        )

    def before_train(self, run: RunView) -> None:
        self._call("before_train", run)

    def needs_eager_step(self, run: RunView) -> bool:
        return any(hook.needs_eager_step(run) for hook in self.hooks)

    def after_step(self, run: RunView, batch: Batch, loss: torch.Tensor) -> None:
        self._call("after_step", run, batch, loss)

    def after_interval(self, run: RunView) -> None:
        self._call("after_interval", run)

    def after_training_epoch(self, run: RunView, values: dict[str, Any]) -> None:
        self._call("after_training_epoch", run, values)

    def eval_batch(self, run: RunView, section: str, batch: Batch) -> None:
        self._call("eval_batch", run, section, batch)

    def after_eval(self, run: RunView, section: str, values: dict[str, Any], partial: bool) -> None:
        self._call("after_eval", run, section, values, partial)

    def after_train(self, run: RunView, summary: dict[str, Any]) -> None:
        self._call("after_train", run, summary)

    def release(self) -> None:
        for hook in self.hooks:
            hook.release()

    def state_dict(self) -> dict[str, Any]:
        return {hook.name: hook.state_dict() for hook in self.hooks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for hook in self.hooks:
            if hook.name in state:
                hook.load_state_dict(state[hook.name])
