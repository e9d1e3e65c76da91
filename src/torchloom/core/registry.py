"""Finding component classes by the `type:` a config names.

Built-in components register through the `torchloom.components` entry-point group, exactly as
third-party packages do, so the zoo proves the plugin API. A config may also name
`type: package.module:Class`. Either way only a `Component` subclass is ever returned: a name
that resolves to anything else (`os:system`, `builtins:eval`) is refused before it is called.
Nothing is ever `eval`-ed, but naming `package.module:Class` imports that installed module, so
its top-level code runs (as Hydra's `_target_` does); a module that fails to import, however it
fails, is a ComponentError naming the module and the exception. A class that could not run
(an abstract base, a family's method left unimplemented) is refused here too, before anything
is built: see `missing_methods`.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types

from torch import nn
from torch.utils.data import Dataset

from torchloom.core.catalog import (
    claims,
    clear_cache,
    distribution,
    registered_entry_points,
    registered_names,
)
from torchloom.core.component import Component, Loss, Model, Statistic, Task
from torchloom.errors import ComponentError, Problem, did_you_mean

__all__ = [
    "all_components",
    "clear_cache",
    "registered_entry_points",
    "registered_names",
    "resolve",
]


# The bases themselves, and what each family must implement: what the workers call on it.
FAMILY_BASES: tuple[type[Component], ...] = (Component, Model, Loss, Statistic, Task)
REQUIRED_METHODS: dict[type[Component], tuple[str, ...]] = {
    Task: ("__len__", "__getitem__", "output_specs"),
    Statistic: ("update", "compute", "reset"),
    Component: ("forward",),  # models, losses and plain components
}


def missing_methods(cls: type[Component]) -> str:
    """Why `cls` cannot be built and run ('is an abstract base ...', 'does not implement
    forward() ...'), or '' when it can. Checked when a config names it, so that a class that
    would only fail at the first step (`Component.forward` raises NotImplementedError) is
    refused by `loom check`."""
    if cls in FAMILY_BASES:
        what = "component" if cls is Component else cls.family
        return f"is the base class of every {what}, not a component to build"
    if inspect.isabstract(cls):
        abstract = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
        return f"is abstract: it leaves {abstract} unimplemented"
    family = next(base for base in REQUIRED_METHODS if issubclass(cls, base))
    bases = (*FAMILY_BASES, nn.Module, Dataset, object)
    missing = [
        name
        for name in REQUIRED_METHODS[family]
        if next(k for k in cls.__mro__ if name in vars(k)) in bases
    ]
    if not missing:
        return ""
    names = ", ".join(f"{name}()" for name in missing)
    return f"does not implement {names}, which every {cls.family} needs"


def _refuse(type_name: str, where: str, message: str, suggestion: str = "") -> ComponentError:
    return ComponentError([Problem(where, f"type '{type_name}'", message, suggestion)])


def _check_component_class(obj: object, type_name: str, where: str) -> type[Component]:
    if not (inspect.isclass(obj) and issubclass(obj, Component)):
        kind = "a class" if inspect.isclass(obj) else f"a {type(obj).__name__}"
        raise _refuse(
            type_name,
            where,
            f"names {kind}, not a torchloom Component subclass; only Component subclasses can "
            "be built from a config",
        )
    missing = missing_methods(obj)
    if missing:
        raise _refuse(type_name, where, missing, "name a concrete component class")
    return obj


def refused_module(module_name: str) -> str:
    """Why a config may not import `module_name` ("" when it may). Importing runs a module's
    top-level code: Python's standard library holds no component, and some of its modules act
    when imported (`venv.__main__` makes a virtual environment in the working folder,
    `antigravity` opens a browser); a `__main__` module is meant to be run, not imported."""
    parts = module_name.split(".")
    if parts[0] in sys.stdlib_module_names:
        return "it is in the standard library; a config names the user's own code only"
    if "__main__" in parts:
        return "it is a __main__ module, which is meant to be run, not imported"
    return ""


def import_object(path: str) -> object:
    """The object that `package.module:attribute` (or `:Outer.Inner`) names, importing the
    module; a LookupError saying why not. Callers decide what the object may be before they
    call it: this only finds it."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute or ":" in attribute:
        raise LookupError("expected the form 'package.module:Name'")
    refused = refused_module(module_name)
    if refused:
        raise LookupError(refused)
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise LookupError(f"cannot import module '{module_name}': {error}") from error
    except (Exception, SystemExit) as error:
        # Importing runs the module's top-level code; whatever it raises (a SystemExit
        # included, which would otherwise end `loom` with no word) is the module's problem.
        raise LookupError(
            f"importing module '{module_name}' failed: {type(error).__name__}: {error}"
        ) from error
    obj: object = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise LookupError(f"module '{module_name}' has no attribute '{attribute}'")
        obj = getattr(obj, part)
        if isinstance(obj, types.ModuleType):
            # `pkg:venv.main` would reach a module the check above refuses (the standard
            # library's venv) through an attribute of an allowed one.
            raise LookupError(
                f"'{part}' in '{path}' is a module ({obj.__name__}): name an object by its "
                "own module, as 'package.module:Name'"
            )
    # An object another module defines, imported into this one (`pkg:mkstemp` from tempfile),
    # is that module's: refused as it would be by its own name.
    refused = refused_module(getattr(obj, "__module__", None) or module_name)
    if refused:
        raise LookupError(f"'{path}' is defined in {obj.__module__}, and {refused}")
    return obj


def _import_dotted(type_name: str, where: str) -> type[Component]:
    try:
        obj = import_object(type_name)
    except LookupError as error:
        message = str(error)
        if message.startswith("cannot import"):
            hint = "is the package that provides it installed?"
        elif message.startswith("importing module"):
            hint = "the module's top-level code raised it; `--debug` shows the traceback"
        else:
            hint = ""
        raise _refuse(type_name, where, message, hint) from error
    return _check_component_class(obj, type_name, where)


def resolve(type_name: object, where: str = "") -> type[Component]:
    """The Component class a config's `type:` names, or a ComponentError saying why not."""
    if not isinstance(type_name, str) or not type_name:
        raise _refuse(str(type_name), where, "a component type must be a non-empty string")
    if ":" in type_name:
        return _import_dotted(type_name, where)
    options = claims().get(type_name, [])
    builtin = [e for e in options if distribution(e) == "torchloom"]
    if len(options) > 1 and not builtin:
        raise _refuse(
            type_name,
            where,
            "is registered by several packages: "
            + ", ".join(f"{distribution(e)} ({e.value})" for e in options),
            "name the one you mean as 'package.module:Class'",
        )
    entry_point = registered_entry_points().get(type_name)
    if entry_point is None:
        raise _refuse(
            type_name,
            where,
            "is not a registered component",
            did_you_mean(type_name, registered_entry_points())
            or "run `loom components` for the list, or name a class as 'package.module:Class'",
        )
    try:
        loaded = entry_point.load()
    except (Exception, SystemExit) as error:  # a broken plugin is reported, not a crash
        raise _refuse(
            type_name, where, f"its entry point '{entry_point.value}' failed to load: {error}"
        ) from error
    return _check_component_class(loaded, type_name, where)


def all_components() -> dict[str, type[Component]]:
    """Every registered component class by name (loads every entry point)."""
    return {name: resolve(name) for name in registered_names()}
