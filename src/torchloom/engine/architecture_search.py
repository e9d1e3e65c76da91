"""DARTS's bi-level search as a training mode (`training.architecture_search`).

Liu, Simonyan & Yang 2019: the weights w learn on one part of the training set, the
architecture parameters alpha on the other, alternately. Before each weight step the loop
(engine/trainer.py, `train_step`) calls `ArchitectureSearch.step` with the weights' batch:

- first order: alpha moves along grad_alpha L_val(w, alpha);
- second order: along grad_alpha L_val(w', alpha) - xi [grad_alpha L_train(w+, alpha) -
  grad_alpha L_train(w-, alpha)] / (2 eps), with w' = w - xi grad_w L_train(w, alpha) (a
  virtual step at the weights' learning rate xi), w+- = w +- eps grad_w' L_val(w', alpha) and
  eps = epsilon / ||grad_w' L_val||.

Why a training mode and not a `loom search` mode: the search *is* a training run (one run
folder, one loop, its checkpoints and exact resume, its validation and statistics); only the
step differs. Everything else is this module, hooked into the loop at one place per concern
(the step, the epoch's end, the checkpoint). The architecture parameters live in the
searchable components (checkpointed with their weights); their optimizer and the position in
the architecture half of the data are saved here.

A searchable component is any component with `architecture_parameters()`, `genotype()`,
`alpha_softmax()`, `edge_labels()` and `derived_entry()` (the zoo's DartsNetwork): the
engine does not import the zoo.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch
import yaml
from pydantic import ValidationError

from torchloom.config.architecture_search_schema import ArchitectureSearchConfig
from torchloom.config.sampler_schema import SubsetSamplerConfig
from torchloom.config.schema import TrainingConfig
from torchloom.core.component import Batch
from torchloom.core.pipeline import Pipeline
from torchloom.core.registry import resolve
from torchloom.data.atomic_files import write_text_atomic
from torchloom.engine.loaders import SectionLoader, to_device
from torchloom.engine.optim import _check_kwargs, _lookup, _refused_values
from torchloom.engine.step import Precision, WeightedLoss, full_float32
from torchloom.errors import ConfigError, LoomError, Problem, Where, validation_problems

KEY = ("training", "architecture_search")


@runtime_checkable
class Searchable(Protocol):
    def architecture_parameters(self) -> list[torch.nn.Parameter]: ...
    def genotype(self) -> Any: ...
    def alpha_softmax(self) -> dict[str, list[list[float]]]: ...
    def edge_labels(self) -> list[str]: ...
    def derived_entry(self) -> dict[str, Any]: ...


def searchable_components(pipeline: Pipeline) -> dict[str, Searchable]:
    return {n: c for n, c in pipeline.components.items() if isinstance(c, Searchable)}


def check_search(pipeline: Pipeline, training: TrainingConfig, where: Where) -> list[Problem]:
    """What makes `training.architecture_search` impossible, found without data (`loom check`)."""
    search = training.architecture_search
    if search is None:
        return []
    problems = []
    if not searchable_components(pipeline):
        problems.append(
            Problem(
                where(*KEY),
                "training.architecture_search",
                "needs a searchable component (e.g. DartsNetwork) in the pipeline; there is none",
                "use `type: DartsNetwork` for the model, or remove architecture_search",
            )
        )
    clashes = {
        ("sampler",): training.sampler is not None,
        ("precision",): training.precision == "fp16",
        ("compile",): training.compile is not False,
        ("dataloader", "reservoir"): training.dataloader.reservoir is not None,
        ("gradient_accumulation",): training.gradient_accumulation > 1,
    }
    why: dict[tuple[str, ...], str] = {
        ("sampler",): " (the search splits the training set itself)",
        # One architecture step before each weight step: it would step at every batch.
        ("gradient_accumulation",): " (the architecture steps before each weight step)",
    }
    for key, clash in clashes.items():
        if clash:
            name = "training." + ".".join(key)
            message = "cannot be used with training.architecture_search" + why.get(key, "")
            problems.append(Problem(where("training", *key), name, message, f"remove {name}"))
    if search.order == "second" and training.precision == "bf16":
        problems.append(
            Problem(
                where("training", "precision"),
                "training.precision",
                "bf16 cannot be used with architecture_search.order: second: its finite "
                "difference moves each weight by about epsilon / sqrt(weights), below bf16's "
                "resolution (8 bits), so the second-order term would be mostly rounding",
                "train the search in fp32 (remove training.precision), or use order: first",
            )
        )
    try:
        build_arch_optimizer(search, [torch.nn.Parameter(torch.zeros(1))], where)
    except ConfigError as error:
        problems += error.problems
    for component in searchable_components(pipeline).values():
        problems += derived_problems(component, search, where)
    return problems


def derived_problems(
    component: Searchable, search: ArchitectureSearchConfig, where: Where
) -> list[Problem]:
    """A misspelt or invalid `derived` parameter found now, not when derived.yml is trained."""
    entry = {**component.derived_entry(), **search.derived}
    key = where(*KEY, "derived")
    try:
        cls = resolve(entry.pop("type"), key)
        cls.Params.model_validate(entry)
    except LoomError as error:
        return list(error.problems)
    except ValidationError as error:
        return validation_problems(error, where, (*KEY, "derived"), cls.Params)
    return []


def build_arch_optimizer(
    search: ArchitectureSearchConfig, parameters: list[torch.nn.Parameter], where: Where
) -> torch.optim.Optimizer:
    key = (*KEY, "arch_optimizer")
    options = {k: v for k, v in search.arch_optimizer.model_dump().items() if k != "type"}
    cls = _lookup(
        torch.optim, torch.optim.Optimizer, search.arch_optimizer.type, (*key, "type"), where
    )
    _check_kwargs(cls, options, 1, key, where)
    refused = _refused_values(cls, options, key, where)
    if refused:
        raise ConfigError(refused)
    return cls(parameters, **options)


def split_samplers(
    search: ArchitectureSearchConfig,
) -> tuple[SubsetSamplerConfig, SubsetSamplerConfig]:
    """The samplers of the weights' part of the training set and of the architecture's."""
    weights = SubsetSamplerConfig(fraction=search.split, split_seed=search.split_seed)
    return weights, weights.model_copy(update={"complement": True})


# ---- the gradients -------------------------------------------------------------------------
Loss = Callable[[], torch.Tensor]


def first_order_gradient(alphas: Sequence[torch.Tensor], val_loss: Loss) -> list[torch.Tensor]:
    return list(torch.autograd.grad(val_loss(), list(alphas)))


def second_order_gradient(
    alphas: Sequence[torch.Tensor],
    weights: Sequence[torch.Tensor],
    learning_rates: Sequence[float],
    train_loss: Loss,
    val_loss: Loss,
    epsilon: float = 0.01,
) -> list[torch.Tensor]:
    """The unrolled hypergradient (module docstring); `weights` are changed in place during
    the computation and restored exactly. `learning_rates` is xi per weight tensor: with
    param_groups of other rates, the Hessian-vector product is taken along each tensor's
    xi / xi_0 times its gradient (xi_0: the first one's), which is the exact derivative of
    the virtual step they make and the paper's formula when all rates are equal."""
    alphas, weights = list(alphas), list(weights)
    saved = [w.detach().clone() for w in weights]
    with torch.enable_grad():
        train_gradients = torch.autograd.grad(train_loss(), weights, allow_unused=True)
    try:
        with torch.no_grad():  # w' = w - xi grad_w L_train
            for w, g, xi in zip(weights, train_gradients, learning_rates, strict=True):
                if g is not None:
                    w.sub_(xi * g)
        found = torch.autograd.grad(val_loss(), [*alphas, *weights], allow_unused=True)
        alpha_gradients = [
            g if g is not None else torch.zeros_like(a)
            for g, a in zip(found[: len(alphas)], alphas, strict=True)
        ]
        direction = [
            (g if g is not None else torch.zeros_like(w)).detach()
            for g, w in zip(found[len(alphas) :], weights, strict=True)
        ]
        norm = torch.sqrt(sum((d.double() ** 2).sum() for d in direction))  # type: ignore[arg-type]
        eps = epsilon / max(float(norm), 1e-12)

        xi = learning_rates[0] if learning_rates else 0.0
        ratios = [rate / xi if xi else 1.0 for rate in learning_rates]

        def train_alpha_gradients(sign: float) -> list[torch.Tensor]:
            with torch.no_grad():
                for w, w0, d, ratio in zip(weights, saved, direction, ratios, strict=True):
                    w.copy_(w0 + (sign * eps * ratio) * d)
            found = torch.autograd.grad(train_loss(), alphas, allow_unused=True)
            return [
                g if g is not None else torch.zeros_like(a)
                for g, a in zip(found[: len(alphas)], alphas, strict=True)
            ]

        plus, minus = train_alpha_gradients(1.0), train_alpha_gradients(-1.0)
    finally:
        with torch.no_grad():
            for w, w0 in zip(weights, saved, strict=True):
                w.copy_(w0)
    return [
        g - xi * (p - m) / (2 * eps) for g, p, m in zip(alpha_gradients, plus, minus, strict=True)
    ]


# ---- the search --------------------------------------------------------------------------
class ArchitectureSearch:
    """The architecture half of the bi-level search of one run."""

    def __init__(
        self,
        config: ArchitectureSearchConfig,
        pipeline: Pipeline,
        loss: WeightedLoss,
        precision: Precision,
        weights_optimizer: torch.optim.Optimizer,
        data: SectionLoader,
        where: Where,
    ) -> None:
        self.config, self.pipeline, self.loss, self.precision = config, pipeline, loss, precision
        self.weights_optimizer = weights_optimizer
        self.data = data
        self.components = searchable_components(pipeline)
        self.alphas = [a for c in self.components.values() for a in c.architecture_parameters()]
        self.optimizer = build_arch_optimizer(config, self.alphas, where)
        self.passes = 0  # passes over the architecture data begun
        self.position = 0  # batches of the current pass consumed
        self._batches: Iterator[Batch] | None = None
        self.history: list[dict[str, Any]] = []  # alphas' softmax after each epoch

    # ---- data: the architecture half, cycled; the position is part of the checkpoint -----
    def next_batch(self, device: torch.device) -> Batch:
        if self._batches is None:
            self._batches = iter(self.data.epoch(self.passes, start_batch=self.position))
        batch = next(self._batches, None)
        if batch is None:
            self.passes, self.position = self.passes + 1, 0
            self._batches = iter(self.data.epoch(self.passes))
            batch = next(self._batches)
        self.position += 1
        return to_device(batch, device)

    def batch_loss(self, batch: Batch) -> Loss:
        def loss() -> torch.Tensor:
            copy = dict(batch)  # the pipeline adds its outputs to the batch it runs on
            with self.precision.autocast():
                self.pipeline(copy)
                return self.loss(copy)

        return loss

    def step(self, weights_batch: Batch, device: torch.device) -> None:
        """One update of the architecture parameters (before the weights' step on
        `weights_batch`). BatchNorm statistics are restored afterwards: the step changes the
        architecture parameters and nothing else."""
        val_batch = self.next_batch(device)
        buffers = [b.detach().clone() for b in self.pipeline.buffers()]
        for alpha in self.alphas:
            alpha.requires_grad_(True)
        try:
            if self.config.order == "first":
                gradients = first_order_gradient(self.alphas, self.batch_loss(val_batch))
            else:
                weights, rates = self.weights_and_rates()
                with full_float32():  # the finite difference's shift is below TF32's step
                    gradients = second_order_gradient(
                        self.alphas,
                        weights,
                        rates,
                        self.batch_loss(weights_batch),
                        self.batch_loss(val_batch),
                        self.config.epsilon,
                    )
        finally:
            for alpha in self.alphas:
                alpha.requires_grad_(False)
            with torch.no_grad():
                for buffer, saved in zip(self.pipeline.buffers(), buffers, strict=True):
                    buffer.copy_(saved)
        for alpha, gradient in zip(self.alphas, gradients, strict=True):
            alpha.grad = gradient.detach()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def weights_and_rates(self) -> tuple[list[torch.nn.Parameter], list[float]]:
        pairs = [
            (p, float(group["lr"]))
            for group in self.weights_optimizer.param_groups
            for p in group["params"]
            if p.requires_grad
        ]
        return [p for p, _ in pairs], [lr for _, lr in pairs]

    # ---- what each epoch leaves: alphas, genotype.yml, derived.yml -----------------------
    def end_epoch(self, epoch: int, run_dir: Any, config_text: str, log: Any) -> None:
        record: dict[str, Any] = {"epoch": epoch, "components": {}}
        genotypes = {}
        for name, component in self.components.items():
            record["components"][name] = {
                "edges": component.edge_labels(),
                "softmax": component.alpha_softmax(),
            }
            genotypes[name] = component.genotype().yaml_data()
            log.info("epoch %d architecture of '%s': %s", epoch, name, genotypes[name])
        self.history.append(record)
        folder = run_dir / "architecture"
        folder.mkdir(exist_ok=True)
        write_text_atomic(folder / "alphas.json", json.dumps(self.history))
        only = len(genotypes) == 1
        text = yaml.safe_dump(
            next(iter(genotypes.values())) if only else genotypes, sort_keys=False
        )
        write_text_atomic(run_dir / "genotype.yml", text)
        write_text_atomic(run_dir / "derived.yml", self.derived_config(config_text))

    def derived_config(self, config_text: str) -> str:
        """The run's config with each searchable component replaced by the discrete network
        it found (plus `architecture_search.derived`), and the search switched off: what
        `loom train derived.yml` trains from scratch."""
        data = yaml.safe_load(config_text)
        data["training"].pop("architecture_search", None)
        for name, component in self.components.items():
            entry = data["pipeline"][name]
            params = set(type(component.params).model_fields)  # type: ignore[attr-defined]
            kept = {k: v for k, v in entry.items() if k not in params and k != "type"}
            data["pipeline"][name] = {
                **component.derived_entry(),
                **self.config.derived,
                **kept,
            }
        header = "# derived by DARTS (training.architecture_search) from this run's config\n"
        return header + yaml.safe_dump(data, sort_keys=False)

    # ---- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "passes": self.passes,
            "position": self.position,
            "history": self.history,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.passes, self.position = state["passes"], state["position"]
        self.history = list(state["history"])
        self._batches = None


# ---- set-up --------------------------------------------------------------------------------
def with_search_split(sections: Mapping[str, Any]) -> dict[str, Any]:
    """The sections with the training sampler restricted to the weights' part of the set
    when the run searches an architecture; unchanged otherwise."""
    training = sections["training"]
    search = training.architecture_search
    if search is None:
        return dict(sections)
    weights, _ = split_samplers(search)
    return {**sections, "training": training.model_copy(update={"sampler": weights})}


def build_search(
    pipeline: Pipeline,
    training: TrainingConfig,
    loss: WeightedLoss,
    precision: Precision,
    optimizer: torch.optim.Optimizer,
    seed: int,
    where: Where,
    distributed: bool,
) -> ArchitectureSearch | None:
    search = training.architecture_search
    if search is None:
        return None
    if distributed:
        raise ConfigError.at(
            where(*KEY),
            "training.architecture_search",
            "runs in one process only",
            "train without --nproc",
        )
    _, architecture = split_samplers(search)
    section = training.model_copy(update={"sampler": architecture})
    data = SectionLoader(
        "training", pipeline.tasks["training"], section, seed + 1, where, device=precision.device
    )
    return ArchitectureSearch(search, pipeline, loss, precision, optimizer, data, where)
