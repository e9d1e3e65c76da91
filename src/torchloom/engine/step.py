"""What a training step is made of, besides the pipeline: the weighted loss it minimises,
mixed precision (autocast and the fp16 GradScaler), gradient clipping, the divergence guard,
and torch.compile of the models. The step itself, in order, is `TrainingLoop.train_step`
(engine/trainer.py); these are its parts.

Divergence: on the CPU the check is immediate (reading a CPU scalar costs nothing). On a GPU,
reading the loss every step would make the host wait for the device, so the finiteness flag
is copied asynchronously into pinned memory and read one step later, or before validation,
a checkpoint or an epoch's end, whichever comes first: the run still stops within one step,
and no weights a bad loss made are evaluated or saved, without a per-step synchronisation.

Compile (`training.compile`, opt-in): each `Model` with weights is compiled in place
(`nn.Module.compile`), so its state_dict keys, checkpoints, freezing and `load:` are exactly
those of the eager model; the rest of the pipeline stays eager. A compiled model neither calls
nor notices forward hooks registered on its layers after it compiled (torch does not guard on
them), so the passes that observe layers through forward hooks run `running_eagerly()`.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import torch

from torchloom.config.schema import GradientClippingConfig
from torchloom.core.component import Batch, Model
from torchloom.core.pipeline import Pipeline
from torchloom.errors import ConfigError, LoomError, Problem, Where, did_you_mean

if TYPE_CHECKING:
    from torchloom.engine.distributed import Distributed


# ---- the loss ------------------------------------------------------------------------------
class WeightedLoss:
    """The quantity training minimises: the weighted sum of every loss component's output."""

    def __init__(self, pipeline: Pipeline, weights: Mapping[str, float], where: Where) -> None:
        names = [loss.name for loss in pipeline.losses]
        problems = [
            Problem(
                where("training", "loss_weights"),
                f"loss_weights '{name}'",
                "names no loss component",
                did_you_mean(name, names),
            )
            for name in weights
            if name not in names
        ]
        if problems:
            raise ConfigError(problems)
        # (stream the loss is published on, its weight)
        self.terms = [
            (loss.stream_name("loss"), float(weights.get(loss.name, 1.0)))
            for loss in pipeline.losses
        ]
        self.losses = {loss.stream_name("loss"): loss for loss in pipeline.losses}

    @property
    def streams(self) -> list[str]:
        return [stream for stream, _ in self.terms]

    def elements(self, batch: Batch, samples: int) -> dict[str, torch.Tensor | int]:
        """What each loss an evaluation reports is a mean over in this batch: the elements a
        loss counts (`Loss.elements`: a sequence loss's steps) or the samples; "loss", the
        total, as its one loss, or by the samples when several of different units add up."""
        own = {}
        for stream, component in self.losses.items():
            counted = component.elements(batch)
            own[stream] = counted if counted is not None else samples
        total = next(iter(own.values())) if len(own) == 1 else samples
        return {"loss": total, **(own if len(own) > 1 else {})}

    def across_processes(
        self, batch: Batch, samples: int, distributed: Distributed
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """With several processes, each holding its share of the global batch: the global
        batch's loss (what one process would have computed), and this process's loss scaled
        so that DDP's mean of the processes' gradients is that loss's gradient. Each loss is
        a mean over what it counts (`Loss.elements`: the targets it does not ignore, a
        sequence's steps; else the samples), which the processes hold in unequal shares: it is
        weighted by this process's count over the global count. One all-reduce."""
        counts = [self.losses[stream].elements(batch) for stream, _ in self.terms]
        device = batch[self.terms[0][0]].device
        # The samples by a fill, not a copy from the host: a copy to a GPU from pageable
        # memory would wait for its queue at every step.
        own = torch.stack(
            [
                torch.full((), samples, dtype=torch.float64, device=device)
                if count is None
                else count.to(device, torch.float64).reshape(())
                for count in counts
            ]
        )
        values = torch.stack([batch[stream].detach().to(torch.float64) for stream, _ in self.terms])
        # A share that counts nothing has a NaN mean and adds nothing.
        shares = torch.cat([torch.where(own > 0, values * own, 0.0), own])
        distributed.sum(shares)
        summed, counted = shares.split(len(self.terms))
        # A loss that counts nothing in the whole global batch is 0, as one process's mean
        # makes it (`_MeanOverTargets` clamps its count): not 0 / 0.
        counted = counted.clamp(min=1)
        factors = (own * distributed.world / counted).to(torch.float32)
        mean: torch.Tensor | None = None
        scaled: torch.Tensor | None = None
        for index, (stream, weight) in enumerate(self.terms):
            term_mean = weight * summed[index] / counted[index]
            term = weight * batch[stream] * factors[index]
            mean = term_mean if mean is None else mean + term_mean
            scaled = term if scaled is None else scaled + term
        assert mean is not None and scaled is not None, "the handshake guarantees a loss"
        return mean.to(batch[self.terms[0][0]].dtype), scaled

    def __call__(self, batch: Batch) -> torch.Tensor:
        total: torch.Tensor | None = None
        for stream, weight in self.terms:
            term = batch[stream] if weight == 1.0 else weight * batch[stream]
            total = term if total is None else total + term
        assert total is not None, "the handshake guarantees a loss in training"
        return total


def batch_size_of(batch: Batch) -> int:
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            return int(value.shape[0])
        if isinstance(value, list):
            return len(value)
    return 0


# ---- precision and clipping ----------------------------------------------------------------
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """Autocast to the config's dtype, and the GradScaler fp16 needs (bf16 needs none). The
    scaler is always there, disabled unless fp16: a disabled scaler's `scale`, `unscale_`,
    `step` and `update` are the plain operations, so the step reads the same for every mode.
    An fp16 scaler skips steps whose gradients overflow (that is not divergence)."""

    def __init__(self, mode: str, device: torch.device) -> None:
        self.mode = mode
        self.device = device
        self.dtype = DTYPES.get(mode)
        self.scaler = torch.amp.GradScaler(device.type, enabled=mode == "fp16")

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """The optimizer's step through the scaler, and the scaler's update; whether the step
        was taken (fp16 skips one whose gradients overflowed). Told by the optimizer's own
        post-step hook, which runs only when the step does: reading the scale back would make
        the host wait for the GPU at every step."""
        if self.scaler.is_enabled() and getattr(optimizer, "_step_supports_amp_scaling", False):
            # A fused optimizer is always stepped by the scaler and skips an overflowed
            # update inside its kernel, so its hook runs either way: the scaler's overflow
            # flags say (one wait for the GPU, as the scaler makes for other optimizers).
            self.scaler.step(optimizer)
            overflowed = self.scaler._found_inf_per_device(optimizer).values()
            skipped = any(bool(found.item()) for found in overflowed)
            self.scaler.update()
            return not skipped
        taken: list[bool] = []
        handle = optimizer.register_step_post_hook(lambda *_: taken.append(True))
        try:
            self.scaler.step(optimizer)
            self.scaler.update()
        finally:
            handle.remove()
        return bool(taken)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """torch.autocast to the dtype; a plain block in full precision (every step enters
        it: a bare nullcontext costs least)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)


@contextlib.contextmanager
def full_float32() -> Iterator[None]:
    """Convolutions and matrix products in full float32 within: on Ampere and later GPUs cuDNN
    convolutions use TF32 by default, which reads 10 bits of each float32 mantissa, so weights
    that differ by less (a finite difference's) compute the same (TF32 is off here for them)."""
    conv = getattr(torch.backends.cudnn, "conv", None)
    flags: list[tuple[Any, str, Any]]
    if conv is not None and hasattr(conv, "fp32_precision"):  # torch 2.9 and later
        flags = [(conv, "fp32_precision", "ieee")]
        flags.append((torch.backends.cuda.matmul, "fp32_precision", "ieee"))
    else:
        flags = [(torch.backends.cudnn, "allow_tf32", False)]
        flags.append((torch.backends.cuda.matmul, "allow_tf32", False))
    before = [getattr(owner, name) for owner, name, _ in flags]
    for owner, name, value in flags:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for (owner, name, _), value in zip(flags, before, strict=True):
            setattr(owner, name, value)


def clip_gradients(
    parameters: list[torch.nn.Parameter], clipping: GradientClippingConfig | None
) -> None:
    """`training.gradient_clipping`: by norm, by value, both or neither (on unscaled
    gradients, so the thresholds mean what they say)."""
    if clipping is None:
        return
    if clipping.norm:
        torch.nn.utils.clip_grad_norm_(parameters, clipping.norm, clipping.norm_type)
    if clipping.value:
        torch.nn.utils.clip_grad_value_(parameters, clipping.value)


# ---- divergence ----------------------------------------------------------------------------
class Diverged(LoomError):
    headline = "training diverged"


class DivergenceGuard:
    """Stops a run whose loss turns NaN or infinite, within one step, naming the loss.

    On the CPU the check is immediate. Deferred (on a GPU), a step's flag is read at the next
    step's check, after that step's backward pass and optimizer step ran on weights the bad
    loss made: so `settle` reads the flag still pending, and the loop calls it before anything
    uses or keeps the weights (validation, a checkpoint, an epoch's end)."""

    def __init__(
        self, device: torch.device, loss_streams: list[str], deferred: bool | None = None
    ) -> None:
        self.device = device
        self.streams = loss_streams
        self.deferred = device.type == "cuda" if deferred is None else deferred
        # (finiteness flag, the event after which it holds on a GPU, the losses, episode)
        self._pending: tuple[torch.Tensor, Any, dict[str, torch.Tensor], int] | None = None

    def check(self, total: torch.Tensor, batch: Batch, episode: int) -> None:
        if not self.deferred:  # the value is at hand: the parts only when it is bad
            if not math.isfinite(float(total.detach())):
                self._raise({s: batch[s].detach() for s in self.streams}, episode)
            return
        parts = {s: batch[s].detach() for s in self.streams}  # read once the step is done
        self.settle()
        finite = torch.isfinite(total.detach())
        event = None
        if self.device.type == "cuda":
            flag = torch.empty((), dtype=torch.bool, pin_memory=True)
            flag.copy_(finite, non_blocking=True)
            # On the loss's GPU's stream: a bare record() records on the current GPU's, which
            # is not the run's with --device cuda:N (N > 0), and the flag would be read early.
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(finite.device))
            finite = flag
        self._pending = (finite, event, parts, episode)

    def settle(self) -> None:
        """Raise Diverged if the step still pending (deferred) had a loss that is not finite;
        waits for the device to have computed it."""
        if self._pending is None:
            return
        flag, event, parts, episode = self._pending
        self._pending = None
        if event is not None:
            event.synchronize()
        if not bool(flag):
            self._raise(parts, episode)

    def _raise(self, parts: dict[str, torch.Tensor], episode: int) -> None:
        bad = [f"'{s}' = {float(v):g}" for s, v in parts.items() if not math.isfinite(float(v))]
        raise Diverged.at(
            "",
            f"episode {episode}",
            f"loss {', '.join(bad) or 'total'} is not finite",
            "lower the learning rate, clip gradients (training.gradient_clipping) or check "
            "the inputs",
        )


# ---- torch.compile -------------------------------------------------------------------------
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile_options(setting: bool | Mapping[str, Any], where: Where) -> dict[str, Any] | None:
    """The keyword arguments for torch.compile that `training.compile` asks for, or None
    when it is off; a ConfigError names a key torch.compile does not take or an unknown mode.
    Checked without compiling, so `loom check` rejects a misspelt one."""
    if setting is False:
        return None
    options = {} if setting is True else dict(setting)
    accepted = [name for name in inspect.signature(torch.compile).parameters if name != "model"]
    problems = [
        Problem(
            where("training", "compile", key),
            f"training.compile.{key}",
            "is not an argument of torch.compile",
            did_you_mean(key, accepted) or f"arguments: {', '.join(accepted)}",
        )
        for key in options
        if key not in accepted
    ]
    mode = options.get("mode")
    if mode is not None and mode not in COMPILE_MODES:
        problems.append(
            Problem(
                where("training", "compile", "mode"),
                "training.compile.mode",
                f"is {mode!r}, not a torch.compile mode",
                did_you_mean(str(mode), list(COMPILE_MODES))
                or f"modes: {', '.join(COMPILE_MODES)}",
            )
        )
    if problems:
        raise ConfigError(problems)
    return options


def compile_models(pipeline: Pipeline, options: dict[str, Any]) -> list[str]:
    """Compile every model with weights in place; the names of those compiled. On a GPU
    `mode: reduce-overhead` replays the models' kernels as CUDA graphs, which is what a small
    model whose step is bound by Python and kernel launches needs."""
    compiled = []
    for name, component in pipeline.components.items():
        if isinstance(component, Model) and any(True for _ in component.parameters()):
            component.compile(**options)
            compiled.append(name)
    if compiled and replays_cuda_graphs(options):
        # One pipeline forward is one CUDA-graph step: the encoder's outputs stay alive for
        # the model that reads them (without the mark, an evaluation pass failed on a GPU:
        # "accessing tensor output of CUDAGraphs that has been overwritten").
        pipeline.begin_each_forward_with(torch.compiler.cudagraph_mark_step_begin)
    return compiled


def replays_cuda_graphs(options: Mapping[str, Any]) -> bool:
    """Whether torch.compile with `options` replays CUDA graphs (on a GPU): the modes
    reduce-overhead and max-autotune, Inductor's `triton.cudagraphs` option, the cudagraphs
    backend."""
    from torch._inductor import list_mode_options  # torch.compile imports it in any case

    if options.get("backend") == "cudagraphs":
        return True
    settings = dict(list_mode_options(options.get("mode")))
    extra = options.get("options")
    if isinstance(extra, Mapping):
        settings.update(extra)
    return bool(settings.get("triton.cudagraphs", False))


def running_eagerly(needed: bool = True) -> AbstractContextManager[Any]:
    """A block in which every torch.compile'd model runs its eager forward (and restores the
    compiler's previous stance on the way out, even after an exception); a plain block when
    not `needed` (nothing compiled), which also keeps torch._dynamo from being imported."""
    return torch.compiler.set_stance("force_eager") if needed else nullcontext()
