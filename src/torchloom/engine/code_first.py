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

import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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
from torchloom.engine.checkpoint import load_checkpoint
from torchloom.engine.run_state import TrainOptions
from torchloom.engine.seeding import seed_everything
from torchloom.engine.summary import RunResult
from torchloom.engine.trainer import Trainer as _Loop
from torchloom.engine.training_setup import build_run_state
from torchloom.errors import ConfigError, Problem


def _where(*keys: Any) -> str:
    return "Trainer.fit(...)" + ("" if not keys else " " + ".".join(str(k) for k in keys))


class DatasetTask(Task):
    """A torch Dataset as a task: samples are dicts of streams, or (inputs, targets) pairs."""

    def __init__(self, dataset: Any, section: str, store: GlobalsStore) -> None:
        super().__init__(ComponentParams(), BuildContext(f"{section}.task", store=store))
        self.dataset = dataset
        self._specs: dict[str, StreamSpec] = {}
        for key, value in self.collate([self[0]]).items():  # a batch of one: its dtypes, shapes
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
            return dict(sample)
        if isinstance(sample, Sequence) and len(sample) == 2:
            inputs, targets = sample
            return {"inputs": inputs, "targets": torch.as_tensor(targets)}
        raise ConfigError(
            [
                Problem(
                    _where(),
                    f"sample {index} of the dataset",
                    "must be a dict "
                    "of streams or an (inputs, targets) pair, got "
                    f"{type(sample).__name__}",
                )
            ]
        )


class ModuleModel(Model):
    """A user's nn.Module returning {name: outputs.Output}; publishes one stream per output."""

    def __init__(self, module: nn.Module, task: DatasetTask, store: GlobalsStore) -> None:
        super().__init__(ComponentParams(), BuildContext("model", store=store))
        self.module = module
        self.reads = list(task.output_specs())
        batch = task.collate([task[0], task[min(1, len(task) - 1)]])
        with torch.no_grad():  # the dry run: output names and shapes, Lazy layers built
            declared = module(batch)
        if not isinstance(declared, Mapping) or not all(
            isinstance(v, outputs.Output) for v in declared.values()
        ):
            raise ConfigError(
                [
                    Problem(
                        _where("model"),
                        type(module).__name__,
                        "forward(batch) must return {name: torchloom.outputs.Output}",
                    )
                ]
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


class Trainer:
    """Code-first training: `Trainer(**settings).fit(module, train=..., validation=...)`.

    Settings are the keys of a config's `training:` section (optimizer, scheduler, precision,
    gradient_clipping, ...), with `epochs` and `batch_size` as shortcuts; the run folder is
    `<expdir>/<name>/<timestamp>/` as for `loom train`."""

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
        **training: Any,
    ) -> None:
        training.setdefault("dataloader", {}).setdefault("batch_size", batch_size)
        if epochs is not None:
            training.setdefault("terminal_conditions", {})["epoch_limit"] = epochs
        self.training = {"task": {"type": "python"}, **training}
        self.name = name
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
        module class (its weights, optimizer, RNG and position come from its last.pt)."""
        seed = self.training.get("seed")
        seed = seed if isinstance(seed, int) else secrets.randbelow(2**31)
        seed_everything(seed)  # before the dry run, which initialises Lazy layers
        pipeline = self._pipeline(
            module, {"training": train, "validation": validation, "test": test}
        )
        try:
            settings: dict[str, Any] = {**self.training, "seed": seed}
            config = TrainingConfig.model_validate(settings)
        except ValidationError as error:
            raise ConfigError([Problem(_where(), "Trainer settings", str(error))]) from error
        plain = SectionConfig(task={"type": "python"})
        sections: dict[str, BaseModel] = {
            "training": config,
            **{s: plain for s in ("validation", "test") if s in pipeline.tasks},
        }
        record = {
            "name": self.name,
            "training": config.model_dump(),
            "pipeline": f"built in Python from {type(module).__name__}",
        }
        run_dir = None if resume is None else Path(resume).expanduser()
        checkpoint = (
            None if run_dir is None else load_checkpoint(run_dir / "checkpoints" / "last.pt")
        )
        state = build_run_state(
            pipeline,
            sections,
            self.name,
            seed,
            self.options,
            _where,
            "# a code-first run: torchloom.Trainer(...).fit(...)\n" + dump_config(record),
            checkpoint,
            run_dir,
        )
        return _Loop(state).run()

    def _pipeline(self, module: nn.Module, datasets: Mapping[str, Any]) -> Pipeline:
        store = GlobalsStore()
        tasks = {s: DatasetTask(d, s, store) for s, d in datasets.items() if d is not None}
        model = ModuleModel(module, tasks["training"], store)
        losses = [
            OutputLoss(n, o, store)
            for n, o in model.declared.items()
            if isinstance(o, (outputs.Classification, outputs.Regression))
        ]
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
                statistics.append(accuracy(accuracy.Params(), context))
        weights = {loss.name: loss.output.weight for loss in losses}
        self.training["loss_weights"] = {**weights, **self.training.get("loss_weights", {})}
        pipeline = Pipeline(tasks, [model, *losses, *statistics], store, {})
        handshake(pipeline, _where)
        return pipeline
