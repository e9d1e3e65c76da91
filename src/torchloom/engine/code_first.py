"""Training a plain `nn.Module` on plain datasets through the same engine as YAML pipelines
(Torch Research Workflows' code-first style).

    trainer = torchloom.Trainer(epochs=3, batch_size=64, optimizer={"type": "Adam", "lr": 1e-3})
    result = trainer.fit(Net(), train=train_set, validation=validation_set)

The module is wrapped in a Model component whose streams come from a dry run on two samples
(which also materialises `nn.Lazy*` layers: no home-made shape inference); each declared
output gets the Loss (and Statistic) its kind implies; the datasets become Tasks. Then the
pipeline goes through the same handshake, loop, checkpoints and run folder.
"""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeGuard

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ValidationError
from torch import nn

from torchloom.config import dump_config
from torchloom.config.schema import SectionConfig, TrainingConfig
from torchloom.core import outputs
from torchloom.core.component import Batch, BuildContext, ComponentParams, Loss, Model, Task
from torchloom.core.globals_store import GlobalsStore
from torchloom.core.handshake import handshake
from torchloom.core.pipeline import Pipeline
from torchloom.core.registry import resolve
from torchloom.core.streams import Dim, StreamSpec
from torchloom.engine.checkpoint import seed_everything
from torchloom.engine.code_first_sources import (
    FIT_ARGUMENT,
    describe_module,
    open_dataset,
    rebuild_dataset,
    rebuild_module,
)
from torchloom.engine.code_first_sources import KEY as SOURCES
from torchloom.engine.loaders import to_device
from torchloom.engine.resume import check_resumed_config, finished_result
from torchloom.engine.run_folder import RunResult
from torchloom.engine.setup import open_resume_point, start_run
from torchloom.engine.state import Hook, TrainOptions
from torchloom.errors import ConfigError, Where, validation_problems

INDICES = "indices"
ANALYSIS = "Trainer(analysis=...)"
BUILT_IN_PYTHON = "built in Python from"  # config.yaml's `pipeline:` of a code-first run
HookFactory = Callable[[Mapping[str, Any], Pipeline, Where], Sequence[Hook]]


def _where(*keys: Any) -> str:
    return "Trainer.fit(...)" + ("" if not keys else " " + ".".join(str(k) for k in keys))


class DatasetTask(Task):
    """A torch Dataset as a task: samples are dicts of streams, or (inputs, targets) pairs;
    each sample's position in the dataset is the stream `indices` (per-sample reports)."""

    def __init__(self, dataset: Any, section: str, store: GlobalsStore) -> None:
        super().__init__(ComponentParams(), BuildContext(f"{section}.task", store=store))
        self.dataset = dataset
        self._specs: dict[str, StreamSpec] = {}
        for key, value in self.collate([self[0]]).items():  # a batch of one: its dtypes, shapes
            if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                raise ConfigError.at(
                    _where(section),
                    f"sample 0's '{key}'",
                    f"is on {value.device}: samples must be on the host, and torchloom copies "
                    "each batch to the run's device (through pinned memory on a GPU)",
                    "build the dataset from CPU tensors (leave out .cuda() / .to(device))",
                )
            if isinstance(value, torch.Tensor):
                self._specs[key] = StreamSpec(("batch", *value.shape[1:]), value.dtype, key)
            else:
                self._specs[key] = StreamSpec(("batch",), type(value[0]), key)

    def output_specs(self) -> dict[str, StreamSpec]:
        return dict(self._specs)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Batch:
        sample = self.dataset[index]
        if isinstance(sample, Mapping):
            return {INDICES: index, **sample}  # the sample's own `indices` win
        if isinstance(sample, Sequence) and len(sample) == 2:
            inputs, targets = sample
            return {"inputs": inputs, "targets": torch.as_tensor(targets), INDICES: index}
        raise ConfigError.at(
            _where(),
            f"sample {index} of the dataset",
            f"must be a dict of streams or an (inputs, targets) pair, got {type(sample).__name__}",
        )


def _device_of(module: nn.Module) -> torch.device:
    """Where a module's weights are (the host for one without any)."""
    tensor = next(itertools.chain(module.parameters(), module.buffers()), None)
    return tensor.device if tensor is not None else torch.device("cpu")


class ModuleModel(Model):
    """A user's nn.Module returning {name: outputs.Output}; publishes one stream per output."""

    def __init__(self, module: nn.Module, task: DatasetTask, store: GlobalsStore) -> None:
        super().__init__(ComponentParams(), BuildContext("model", store=store))
        self.module = module
        self.reads = list(task.output_specs())
        batch = task.collate([task[0], task[min(1, len(task) - 1)]])
        batch = to_device(batch, _device_of(module))  # a module `fit` trained is on its GPU
        with torch.no_grad():  # the dry run: output names and shapes, Lazy layers built
            declared = module(batch)
        if not isinstance(declared, Mapping) or not all(
            isinstance(v, outputs.Output) for v in declared.values()
        ):
            raise ConfigError.at(
                _where("model"),
                type(module).__name__,
                "forward(batch) must return {name: torchloom.outputs.Output}",
            )
        self.declared: dict[str, outputs.Output] = dict(declared)

    def input_specs(self) -> dict[str, StreamSpec]:
        return {name: StreamSpec(None, None, "read by the module") for name in self.reads}

    def output_specs(self) -> dict[str, StreamSpec]:
        specs = {}
        for name, out in self.declared.items():
            dims: list[Any] = ["batch", *out.value.shape[1:]]
            if isinstance(out, outputs.Classification):
                dims[-1] = Dim("classes", int(out.value.shape[-1]))
            specs[name] = StreamSpec(dims, out.value.dtype, type(out).__name__.lower())
        return specs

    def forward(self, inputs: Batch) -> Batch:
        return {name: out.value for name, out in self.module(inputs).items()}


class OutputLoss(Loss):
    """The loss a declared output implies (cross entropy, mse, l1, smooth l1)."""

    def __init__(
        self, name: str, output: outputs.Classification | outputs.Regression, store: GlobalsStore
    ) -> None:
        target = getattr(output, "target", "targets")
        context = BuildContext(
            f"{name}_loss",
            {"predictions": name, "targets": target, "loss": f"{name}_loss"},
            store=store,
        )
        super().__init__(ComponentParams(), context)
        self.output = output

    def input_specs(self) -> dict[str, StreamSpec]:
        return {
            "predictions": StreamSpec(None, None, "the output"),
            "targets": StreamSpec(None, None, "what it is trained against"),
        }

    def forward(self, inputs: Batch) -> Batch:
        prediction, target = inputs["predictions"], inputs["targets"]
        out = self.output
        if isinstance(out, outputs.Classification):
            loss = F.cross_entropy(
                prediction.float(),
                target,
                ignore_index=out.ignore_index,
                label_smoothing=out.label_smoothing,
            )
        else:
            assert isinstance(out, outputs.Regression)
            function = {"mse": F.mse_loss, "l1": F.l1_loss, "smooth_l1": F.smooth_l1_loss}
            loss = function[out.loss](prediction.float(), target.float())
        return {"loss": loss}


def _validated(settings: Mapping[str, Any]) -> TrainingConfig:
    """Trainer(...)'s keyword arguments, which are the training section's keys, validated."""
    try:
        return TrainingConfig.model_validate(dict(settings))
    except ValidationError as error:
        problems = validation_problems(error, lambda *_: "Trainer(...)", (), TrainingConfig)
        raise ConfigError(problems) from error


class CodeFirstTrainer:
    """Code-first training: `Trainer(**settings).fit(module, train=..., validation=...)`.

    Settings are the keys of a config's `training:` section (optimizer, scheduler, precision,
    gradient_clipping, ...), with `epochs` and `batch_size` as shortcuts; the run folder is
    `<expdir>/<name>/<timestamp>/` as for `loom train`. `analysis` is what a config's
    `analysis:` section holds (a preset name or a mapping; None: the default preset; False:
    none); its hooks come from `hook_factory`, which `torchloom.Trainer` sets (the engine
    never imports the analysis package)."""

    hook_factory: HookFactory | None = None

    def __init__(
        self,
        epochs: int | None = None,
        batch_size: int = 64,
        *,
        name: str = "module",
        expdir: str | os.PathLike[str] = "runs",
        device: str | None = None,
        quiet: bool = True,
        tensorboard: int = 1,
        analysis: str | Mapping[str, Any] | bool | None = None,
        **training: Any,
    ) -> None:
        training.setdefault("dataloader", {}).setdefault("batch_size", batch_size)
        if epochs is not None:
            training.setdefault("terminal_conditions", {})["epoch_limit"] = epochs
        self.training = {"task": {"type": "python"}, **training}
        _validated(self.training)  # a misspelt setting is an error here, not at fit()
        self.name = name
        self.analysis = analysis
        self.options = TrainOptions(
            expdir=str(expdir), device=device, quiet=quiet, tensorboard=tensorboard
        )

    def fit(
        self,
        module: nn.Module,
        train: Any,
        validation: Any = None,
        test: Any = None,
        resume: str | os.PathLike[str] | None = None,
    ) -> RunResult:
        """Train `module`; `resume` continues the run folder of an earlier fit of the same
        module class (its weights, optimizer, RNG and position come from its last.pt).

        A dataset is an object, or a zero-argument factory (a function or a Dataset class, or
        its `package.module:name`): a factory that imports is recorded in config.yaml, so
        `loom process RUN_DIR` can build the data again (see engine/code_first_sources.py)."""
        # The validated seed: a numpy integer, 5.0 or "5" validate as the int 5, which is
        # the seed the run uses and records (only a Python int used to be taken).
        seed = _validated(self.training).seed
        seed = seed if seed is not None else secrets.randbelow(2**31)
        seed_everything(seed)  # before the dry run, which initialises Lazy layers
        given = {"training": train, "validation": validation, "test": test}
        datasets, sources = {}, {}
        for section, value in given.items():
            if value is not None:
                where = _where(FIT_ARGUMENT[section])
                datasets[section], sources[section] = open_dataset(value, section, where)
        pipeline = build_pipeline(module, datasets)
        declared = _declared(pipeline)
        weights = {f"{n}_loss": o.weight for n, o in declared.items() if _has_loss(o)}
        self.training["loss_weights"] = {**weights, **self.training.get("loss_weights", {})}
        config = _validated({**self.training, "seed": seed})
        plain = SectionConfig(task={"type": "python"})
        sections: dict[str, BaseModel] = {
            "training": config,
            **{s: plain for s in ("validation", "test") if s in pipeline.tasks},
        }
        analysis = self._analysis_section(declared)
        options = self.options
        if analysis is not None and self.hook_factory is not None:
            hooks = self.hook_factory({"analysis": analysis}, pipeline, lambda *_: ANALYSIS)
            options = replace(options, hooks=[*options.hooks, *hooks])
        record = {
            "name": self.name,
            **{s: c.model_dump() for s, c in sections.items()},
            **({"analysis": analysis} if analysis is not None else {}),
            SOURCES: {"module": describe_module(module), "data": sources},
            "pipeline": f"{BUILT_IN_PYTHON} {type(module).__name__}",
        }
        config_text = (
            "# a code-first run: torchloom.Trainer(...).fit(...); `loom process` builds it again "
            f"from `{SOURCES}`\n" + dump_config(record)
        )
        point = None
        if resume is not None:
            point = open_resume_point(Path(resume).expanduser(), f"fit(resume={resume!r})")
            try:
                if point.checkpoint.get("config"):
                    started = point.checkpoint["config"]
                    check_resumed_config(started, config_text, _where(), "Trainer settings")
                has_validation = "validation" in sections
                finished = finished_result(point.run_dir, point.checkpoint, config, has_validation)
            except BaseException:
                point.lock.release()
                raise
            if finished is not None:
                point.lock.release()
                return finished
        loop = start_run(
            pipeline,
            sections,
            name=self.name,
            seed=seed,
            options=options,
            where=_where,
            config_text=config_text,
            resume=point,
        )
        return loop.run()

    def _analysis_section(self, declared: Mapping[str, outputs.Output]) -> dict[str, Any] | None:
        """The `analysis:` section this run stands for; its outputs default to the module's
        Classification outputs (a YAML pipeline's default is its `predictions` stream)."""
        value = self.analysis
        if value is False:
            return None
        if self.hook_factory is None and value not in (None, True):
            raise TypeError("this Trainer runs no analysis: use torchloom.Trainer")
        if value is None or value is True:
            section: dict[str, Any] = {}
        elif isinstance(value, str):
            section = {"preset": value}
        elif isinstance(value, Mapping):
            section = dict(value)
        else:
            message = f"must be a preset name, a mapping or False, got {type(value).__name__}"
            raise ConfigError.at(ANALYSIS, "analysis", message)
        section.setdefault(
            "outputs",
            [
                {"name": name, "predictions": name, "targets": out.target, "ids": INDICES}
                for name, out in declared.items()
                if isinstance(out, outputs.Classification)
            ],
        )
        return section


def _has_loss(output: outputs.Output) -> TypeGuard[outputs.Classification | outputs.Regression]:
    return isinstance(output, (outputs.Classification, outputs.Regression))


def _declared(pipeline: Pipeline) -> dict[str, outputs.Output]:
    model = pipeline.components["model"]
    assert isinstance(model, ModuleModel)
    return model.declared


def build_pipeline(module: nn.Module, datasets: Mapping[str, Any]) -> Pipeline:
    """The pipeline of a module and its datasets ({section: dataset}), handshaken: the module
    as the `model`, a loss per trained output, an accuracy per Classification output."""
    store = GlobalsStore()
    tasks = {s: DatasetTask(d, s, store) for s, d in datasets.items()}
    first = tasks.get("training") or next(iter(tasks.values()))  # the dry run's samples
    model = ModuleModel(module, first, store)
    losses = [OutputLoss(n, o, store) for n, o in model.declared.items() if _has_loss(o)]
    statistics = []
    for name, out in model.declared.items():
        if isinstance(out, outputs.Classification):
            context = BuildContext(
                f"{name}_accuracy", {"predictions": name, "targets": out.target}, store=store
            )
            store.publish(f"{name}_classes", int(out.value.shape[-1]), "Trainer")
            context.global_names = {"num_classes": f"{name}_classes"}
            # Through the registry, as a config would: the engine does not import the zoo.
            accuracy = resolve("AccuracyStatistics")
            # The targets the loss ignores are left out of the count too (the analysis
            # reports leave them out: the two must agree).
            params = accuracy.Params(ignore_index=out.ignore_index)
            statistics.append(accuracy(params, context))
    pipeline = Pipeline(tasks, [model, *losses, *statistics], store, {})
    handshake(pipeline, _where)
    return pipeline


def rebuild_pipeline(
    record: Any, section: str, where: Where, module: Any = None, data: Any = None
) -> Pipeline:
    """The pipeline of a code-first run for one section: the module and dataset from the run's
    record (config.yaml's `code_first`), or the ones given in code."""
    if module is None:
        module = rebuild_module(record, where)
    if data is None:
        dataset = rebuild_dataset(record, section, where)
    else:
        dataset, _ = open_dataset(data, section, f"process(data=...) for {section}")
    return build_pipeline(module, {section: dataset})
