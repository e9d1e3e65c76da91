"""Hyper-parameter search on Optuna: spaces in YAML, one training run per trial, studies in
a journal file or a database, importance and a report page (docs/search.md).

`torchloom.search(...)` is this package called as a function (search/api.py): the package
and the function share the name the issue and the docs give them, so the module's class is
made callable (a documented Python hook: a module's `__class__` may be a ModuleType
subclass). Importing the package imports nothing else; the call loads torch and Optuna.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallablePackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from torchloom.search.api import search

        return search(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
