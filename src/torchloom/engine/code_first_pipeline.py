"""The pipeline of a code-first run: a user's `nn.Module` and plain datasets as components.

The module is wrapped in a Model component whose streams come from a dry run on two samples
(which also materialises `nn.Lazy*` layers: no home-made shape inference); each declared
output gets the Loss (and Statistic) its kind implies; the datasets become Tasks. Then the
pipeline goes through the same handshake as a config's. `Trainer.fit` (engine/code_first.py)
trains it; the processor builds it again for one section (`loom process`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

import torch
import torch.nn.functional as F
from torch import nn

from torchloom.core import outputs
from torchloom.core.component import Batch, BuildContext, ComponentParams, Loss, Model, Task
from torchloom.core.globals_store import GlobalsStore
from torchloom.core.handshake import handshake
from torchloom.core.pipeline import Pipeline
from torchloom.core.registry import resolve
from torchloom.core.streams import Dim, StreamSpec
from torchloom.engine.checkpoint import seed_everything
from torchloom.engine.code_first_sources import (
    KEY,
    open_dataset,
    rebuild_dataset,
    rebuild_module,
    seed_for_section,
)
from torchloom.engine.loaders import to_device
from torchloom.errors import ConfigError, LoomError, Where, first_line

INDICES = "indices"
BUILT_IN_PYTHON = "built in Python from"  # config.yaml's `pipeline:` of a code-first run


def fit_where(*keys: Any) -> str:
    """Where a problem of a code-first run is: `Trainer.fit(...)` and the argument's keys."""
    return "Trainer.fit(...)" + ("" if not keys else " " + ".".join(str(k) for k in keys))


class DatasetTask(Task):
    """A torch Dataset as a task: samples are dicts of streams, or (inputs, targets) pairs;
    each sample's position in the dataset is the stream `indices` (per-sample reports)."""

    def __init__(self, dataset: Any, section: str, store: GlobalsStore) -> None:
        super().__init__(ComponentParams(), BuildContext(f"{section}.task", store=store))
        self.dataset = dataset
        self._specs: dict[str, StreamSpec] = {}
        self.sample_shapes: dict[str, tuple[int, ...]] = {}  # a tensor stream's, per sample
        for key, value in self.collate([self[0]]).items():  # a batch of one: its dtypes, shapes
            if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                raise ConfigError.at(
                    fit_where(section),
                    f"sample 0's '{key}'",
                    f"is on {value.device}: samples must be on the host, and torchloom copies "
                    "each batch to the run's device (through pinned memory on a GPU)",
                    "build the dataset from CPU tensors (leave out .cuda() / .to(device))",
                )
            if isinstance(value, torch.Tensor):
                self._specs[key] = StreamSpec(("batch", *value.shape[1:]), value.dtype, key)
                self.sample_shapes[key] = tuple(value.shape[1:])
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
            fit_where(),
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
        declared = self.dry_run(task)
        if not isinstance(declared, Mapping) or not all(
            isinstance(v, outputs.Output) for v in declared.values()
        ):
            raise ConfigError.at(
                fit_where("model"),
                type(module).__name__,
                "forward(batch) must return {name: torchloom.outputs.Output}",
            )
        self.declared: dict[str, outputs.Output] = dict(declared)

    def dry_run(self, task: DatasetTask) -> Any:
        """The module's outputs for two of the task's samples: without gradients and in eval
        mode (a pretrained module's BatchNorm statistics are not moved by it), each
        submodule's mode restored after."""
        batch = task.collate([task[0], task[min(1, len(task) - 1)]])
        batch = to_device(batch, _device_of(self.module))  # a module `fit` trained is on its GPU
        modes = [(part, part.training) for part in self.module.modules()]
        self.module.eval()
        try:
            with torch.no_grad():
                return self.module(batch)
        except KeyError as error:
            missing = error.args[0] if error.args else None
            if not isinstance(missing, str) or missing in batch:
                raise  # not a stream the batch lacks: the module's own bug
            raise ConfigError.at(
                fit_where("model"),
                f"{type(self.module).__name__}.forward",
                f"reads the stream '{missing}' (KeyError), which the batch does not "
                f"have; its streams: {', '.join(batch)}",
                "read one of these, or have the dataset's samples be dicts of streams "
                "that include it",
            ) from error
        finally:
            for part, training in modes:
                part.training = training

    def check_reads(self, task: DatasetTask, section: str) -> None:
        """The module takes `section`'s samples too: a validation set of another width
        failed a whole training epoch later, with torch's bare error."""
        try:
            self.dry_run(task)
        except ConfigError:
            raise
        except Exception as error:
            raise ConfigError.at(
                fit_where(section),
                f"the {section} data",
                f"cannot go through {type(self.module).__name__}, which takes the training "
                f"data: {type(error).__name__}: {first_line(error)}",
                "give every section samples of the same streams and shapes",
            ) from error

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


def has_loss(output: outputs.Output) -> TypeGuard[outputs.Classification | outputs.Regression]:
    return isinstance(output, (outputs.Classification, outputs.Regression))


def declared_outputs(pipeline: Pipeline) -> dict[str, outputs.Output]:
    model = pipeline.components["model"]
    assert isinstance(model, ModuleModel)
    return model.declared


def _shown(shape: Sequence[int]) -> str:
    return "[" + ", ".join(["batch", *(str(n) for n in shape)]) + "]"


def _check_regression_shapes(declared: Mapping[str, outputs.Output], task: DatasetTask) -> None:
    """A Regression's value and target must have one shape: torch's losses broadcast
    [batch, 1] against [batch] to [batch, batch], a wrong loss it only warns about."""
    for name, out in declared.items():
        if not isinstance(out, outputs.Regression):
            continue
        target = task.sample_shapes.get(out.target)
        if target is None or tuple(out.value.shape[1:]) == target:
            continue
        predicted, expected = tuple(out.value.shape[1:]), _shown(target)
        fix = "value.squeeze(-1)" if predicted == (*target, 1) else "a reshaped value"
        raise ConfigError.at(
            fit_where("model"),
            f"Regression output '{name}'",
            f"is {_shown(predicted)} and its target stream '{out.target}' is {expected}: "
            "the loss would broadcast one against the other",
            f"return a value of the target's shape (here {fix}), or reshape the targets",
        )


def build_pipeline(module: nn.Module, datasets: Mapping[str, Any]) -> Pipeline:
    """The pipeline of a module and its datasets ({section: dataset}), handshaken: the module
    as the `model`, a loss per trained output, an accuracy per Classification output."""
    store = GlobalsStore()
    tasks = {s: DatasetTask(d, s, store) for s, d in datasets.items()}
    first = tasks.get("training") or next(iter(tasks.values()))  # the dry run's samples
    model = ModuleModel(module, first, store)
    for section, task in tasks.items():
        if task is not first:
            model.check_reads(task, section)
    _check_regression_shapes(model.declared, first)
    losses = [OutputLoss(n, o, store) for n, o in model.declared.items() if has_loss(o)]
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
            params = accuracy.Params.model_validate({"ignore_index": out.ignore_index})
            statistics.append(accuracy(params, context))
    pipeline = Pipeline(tasks, [model, *losses, *statistics], store, {})
    handshake(pipeline, fit_where)
    return pipeline


def rebuild_pipeline(
    record: Any, section: str, seed: int, where: Where, module: Any = None, data: Any = None
) -> Pipeline:
    """The pipeline of a code-first run for one section: the module and dataset from the run's
    record (config.yaml's `code_first`), or the ones given in code. The dataset is opened
    seeded as `fit` opened it (code_first_sources.seed_for_section); the rest, by the run's
    seed."""
    seed_everything(seed)
    rebuilt = module is None
    if module is None:
        module = rebuild_module(record, where)
    seed_for_section(seed, section)
    if data is None:
        dataset = rebuild_dataset(record, section, where)
    else:
        place = f"process(data=...) for {section}"
        dataset, _ = open_dataset(data, section, place, "process(data=...)")
    seed_everything(seed)  # the dry run, as fit's
    try:
        return build_pipeline(module, {section: dataset})
    except LoomError:
        raise
    except Exception as error:
        if not rebuilt:  # the caller's own module: its bug, as fit shows it
            raise
        # A record is input (a run folder from someone else): its module failing on its data
        # is a plain error naming the record, not a traceback.
        message = f"fails on the {section} data (the module or the data the run records): "
        message += f"{type(error).__name__}: {error}"
        subject = f"module {type(module).__name__}"
        raise ConfigError.at(where(KEY, "module"), subject, message) from error
