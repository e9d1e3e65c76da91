"""Where a code-first run's module and datasets come from, so that `loom process` can build
them again: recorded by `Trainer.fit` in the run's config.yaml, resolved by the processor.

    code_first:
      module: {class: my_pkg.models:Net, init_args: {width: 64}}
      data:
        training: {factory: my_pkg.data:train_set}
        test: {unavailable: "a TensorDataset object was given; give fit an importable ..."}

A module is rebuilt from its class's import path and its constructor arguments: those of its
`hparams` mapping (as Lightning's `save_hyperparameters` keeps them), or none when its
constructor takes none. A dataset is rebuilt when `fit` was given an importable zero-argument
factory (a function, or a Dataset class) or its `package.module:name`, instead of an object.
What cannot be rebuilt is recorded with the reason, which `loom process` then reports.

A config is untrusted input and this record names code to run, so only what `fit` could have
recorded is ever called: an `nn.Module` subclass, a Python function or a Dataset class,
outside the standard library. The checks happen before anything is called.
"""

from __future__ import annotations

import inspect
import random
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.parameter import is_lazy
from torch.utils.data import DataLoader, Dataset, IterableDataset

from torchloom.config.schema import CODE_FIRST_KEY
from torchloom.core.registry import import_object, refused_module
from torchloom.engine.checkpoint import seed_everything
from torchloom.errors import ConfigError, Problem, Where
from torchloom.host_memory import short_of_memory

KEY = CODE_FIRST_KEY  # the top-level key of config.yaml holding the record
MODULE_HINT = "then train again, or pass the module in code: torchloom.process(run_dir, module=...)"
DATA_HINT = (
    "then train again, or pass the data in code: "
    "torchloom.process(run_dir, section='{section}', data=...)"
)
FACTORY = (
    "give fit an importable zero-argument factory instead (a function or a Dataset class, or "
    "its 'package.module:name')"
)
FIT_ARGUMENT = {"training": "train", "validation": "validation", "test": "test"}


def import_path(obj: Any) -> tuple[str | None, str]:
    """`package.module:Name` that imports `obj` back, else (None, why not)."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return None, f"a {type(obj).__name__} object has no import path"
    if module == "__main__":
        why = "is defined in __main__ (the script that ran); move it into a module it imports"
        return None, f"{qualname} {why}"
    if "<" in qualname:  # <locals>, <lambda>
        why = "is defined inside a function (or is a lambda); define it at a module's top level"
        return None, f"{qualname} {why}"
    path = f"{module}:{qualname}"
    try:
        found = import_object(path)
    except LookupError as error:
        return None, f"{path} does not import: {error}"
    return (path, "") if found is obj else (None, f"{path} names another object")


def _plain(value: Any) -> bool:
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list | tuple):
        return all(_plain(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def describe_module(module: nn.Module) -> dict[str, Any]:
    """The record of how to build `module` again (or why it cannot be)."""
    cls = type(module)
    path, why = import_path(cls)
    if path is None:
        return {"name": cls.__name__, "unavailable": why}
    hparams = getattr(module, "hparams", None)
    if isinstance(hparams, Mapping):
        arguments = dict(hparams)
        odd = sorted(k for k, v in arguments.items() if not (isinstance(k, str) and _plain(v)))
        if odd:
            why = f"its hparams {odd} are not plain values (numbers, strings, lists, mappings)"
            return {"class": path, "unavailable": why}
        try:
            inspect.signature(cls).bind(**arguments)
        except TypeError as error:
            why = f"its hparams are not its constructor's arguments: {error}"
            return {"class": path, "unavailable": why}
        # An argument left out would be rebuilt with its default, which need not be the value
        # this module was built with: another model, silently. Every one must be recorded.
        missing = [n for n in _named_parameters(cls) if n not in arguments]
        if missing:
            why = (
                f"its hparams lack the constructor's argument(s) {', '.join(missing)} (a rebuild "
                f"would take their defaults); add them to self.hparams in __init__"
            )
            return {"class": path, "unavailable": why}
        return {"class": path, "init_args": arguments}
    if cls.__init__ is nn.Module.__init__ or not inspect.signature(cls).parameters:
        return {"class": path, "init_args": {}}
    names = list(inspect.signature(cls).parameters)
    example = ", ".join(f"'{n}': {n}" for n in names)
    why = (
        f"its constructor takes ({', '.join(names)}) and it has no `hparams` mapping of their "
        f"values; set self.hparams = {{{example}}} in __init__"
    )
    return {"class": path, "unavailable": why}


def seed_for_section(seed: int, section: str) -> None:
    """Seed every generator from the run's seed and a section's name, just before that
    section's dataset is opened: a factory drawing from the global generator then returns the
    same samples whether `fit` calls it among the others or `loom process` calls it alone."""
    seed_everything(zlib.crc32(f"{seed}:{section}".encode()) % 2**31)


def _named_parameters(cls: type) -> list[str]:
    """The constructor's parameters that take a value by name (not *args, **kwargs)."""
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [n for n, p in inspect.signature(cls).parameters.items() if p.kind in named]


def _is_factory(value: Any) -> bool:
    if isinstance(value, type):
        return True
    return callable(value) and not hasattr(value, "__getitem__")


def open_dataset(value: Any, section: str, where: str, argument: str) -> tuple[Any, dict[str, str]]:
    """The dataset that a `fit` argument gives (an object, a factory or its import path) and
    the record of how to get it again. `argument`: how the user gave it (`fit(train=...)`)."""
    if value is None:
        raise ConfigError.at(
            where,
            argument,
            f"is None: the run needs the {section} data",
            "give a map-style Dataset, or a zero-argument factory of one",
        )
    if isinstance(value, str):
        factory = _import_factory(value, where, f"{FIT_ARGUMENT.get(section, section)}='{value}'")
        return _dataset_of(factory, where, value), {"factory": value}
    if not (isinstance(value, type) or (callable(value) and not hasattr(value, "__getitem__"))):
        why = f"a {type(value).__name__} object was given; {FACTORY}"
        return check_dataset(value, where, argument), {"unavailable": why}
    path, why = import_path(value)
    if path is not None:
        why = _not_a_factory(value) or refused_module(path.partition(":")[0]) or ""
    dataset = _dataset_of(value, where, getattr(value, "__qualname__", repr(value)))
    return dataset, ({"factory": path} if path is not None and not why else {"unavailable": why})


def _not_a_factory(obj: Any) -> str:
    if inspect.isfunction(obj) or (isinstance(obj, type) and issubclass(obj, Dataset)):
        return ""
    kind = "a class" if isinstance(obj, type) else f"a {type(obj).__name__}"
    return f"it is {kind}; a dataset factory is a Python function or a Dataset class"


def _dataset_of(factory: Callable[[], Any], where: str, name: str) -> Any:
    return check_dataset(factory(), where, f"factory {name}", "returned")


def check_dataset(dataset: Any, where: str, subject: str, verb: str = "is") -> Any:
    """`dataset` if torchloom can index it (a sampler draws indices, reports name samples by
    them, a resume continues at one): else an error saying what to give instead, where it
    would have been a bare TypeError or IndexError from the first batch."""
    kind = type(dataset).__name__
    if isinstance(dataset, DataLoader):
        raise ConfigError.at(
            where,
            subject,
            f"{verb} a DataLoader: torchloom batches the data itself",
            "give its dataset (loader.dataset) and set the batch size with Trainer(batch_size=...)",
        )
    if isinstance(dataset, IterableDataset) or not (
        hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")
    ):
        raise ConfigError.at(
            where,
            subject,
            f"{verb} a {kind}, not a map-style dataset (__len__ and __getitem__): samples "
            "are drawn by index",
            "give a Dataset with __len__ and __getitem__ (a TensorDataset, or a list of "
            "(inputs, targets) pairs)",
        )
    if len(dataset) == 0:
        raise ConfigError.at(where, subject, f"{verb} a {kind} with no samples", "give data")
    return dataset


def _import_factory(path: str, where: str, subject: str) -> Callable[[], Any]:
    obj = _import(path, where, subject)
    problem = _not_a_factory(obj)
    if problem:
        raise ConfigError.at(where, subject, problem)
    return obj


def _import(path: str, where: str, subject: str) -> Any:
    """What `path` names, refusing the standard library before anything is imported
    (registry.refused_module)."""
    try:
        return import_object(path)
    except LookupError as error:
        hint = "is its folder on PYTHONPATH?" if "cannot import" in str(error) else ""
        raise ConfigError.at(where, subject, str(error), hint) from error


def rebuild_module(record: Any, where: Where) -> nn.Module:
    """The module a run's record describes, built with its recorded arguments."""
    entry = record.get("module") if isinstance(record, Mapping) else None
    entry = entry if isinstance(entry, Mapping) else {}
    if "class" not in entry or "unavailable" in entry:
        subject = f"module {entry.get('class') or entry.get('name') or ''}".strip()
        why = entry.get("unavailable") or "the run records no way to build it (an older run?)"
        problem = Problem(where(KEY, "module"), subject, f"cannot be rebuilt: {why}", MODULE_HINT)
        raise ConfigError([problem])
    path, arguments = str(entry["class"]), entry.get("init_args") or {}
    cls = _import(path, where(KEY, "module", "class"), f"module class '{path}'")
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        message = "is not an nn.Module subclass"
        raise ConfigError.at(where(KEY, "module", "class"), f"module class '{path}'", message)
    try:
        inspect.signature(cls).bind(**arguments)
    except TypeError as error:
        problem = Problem(where(KEY, "module", "init_args"), f"module {path}", str(error))
        raise ConfigError([problem]) from error
    _check_weights_fit(cls, arguments, where(KEY, "module", "init_args"), path)
    try:
        return cls(**arguments)
    except Exception as error:  # the record's arguments are input: a clear error, not a crash
        message = f"cannot be built with its recorded arguments: {type(error).__name__}: {error}"
        raise ConfigError.at(
            where(KEY, "module", "init_args"), f"module {path}", message
        ) from error


def _check_weights_fit(
    cls: type[nn.Module], arguments: Mapping[str, Any], place: str, path: str
) -> None:
    """Refuse recorded arguments whose weights would take more than half of the memory left
    (a record of Linear(15000, 15000) took 1.4 GB, 10^6 x 10^6 a traceback): measured on the
    meta device, which allocates nothing. A module that cannot be built there is not judged."""
    # The probe's constructor may draw random numbers off the meta device (a CPU buffer,
    # Python's or NumPy's generators): the module built next must draw what fit's did.
    states = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            probe = cls(**arguments)
    except Exception:
        return
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
    tensors = [*probe.parameters(), *probe.buffers()]
    # A lazy layer's weights have no shape yet (its first batch gives it): not counted.
    need = sum(t.numel() * t.element_size() for t in tensors if not is_lazy(t))
    available = short_of_memory(need)
    if available is not None:
        raise ConfigError.at(
            place,
            f"module {path}",
            f"its weights would take about {need / 2**30:.1f} GiB, more than half of the "
            f"{available / 2**30:.1f} GiB of memory available",
            "check the run's record (config.yaml, code_first.module.init_args)",
        )


def rebuild_dataset(record: Any, section: str, where: Where) -> Any:
    """The dataset of `section` that a run's record describes."""
    data = record.get("data") if isinstance(record, Mapping) else None
    entry = data.get(section) if isinstance(data, Mapping) else None
    hint = DATA_HINT.format(section=section)
    subject = f"{section} data"
    if not isinstance(entry, Mapping):
        recorded = ", ".join(data) if isinstance(data, Mapping) and data else "none"
        message = f"the run was given no {section} data (it has: {recorded})"
        raise ConfigError.at(where(KEY, "data"), subject, message, hint)
    if "factory" not in entry:
        why = entry.get("unavailable") or "no factory is recorded"
        message = f"cannot be rebuilt: {why}"
        raise ConfigError.at(where(KEY, "data", section), subject, message, hint)
    path = str(entry["factory"])
    place = where(KEY, "data", section, "factory")
    factory = _import_factory(path, place, f"{subject} factory '{path}'")
    return _dataset_of(factory, place, path)
