"""torchloom: YAML pipelines of PyTorch components for vision and language.

`import torchloom` stays light: the workers (and torch) load on first use of `train`,
`process`, and friends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "train": "torchloom.api",
    "process": "torchloom.api",
    "RunResult": "torchloom.engine.run_folder",
    "ProcessResult": "torchloom.engine.processor",
    "Trainer": "torchloom.api",
    "outputs": "torchloom.core.outputs",
    "quantize": "torchloom.api",
    "export": "torchloom.api",
    "search": "torchloom.search",  # a package that is also a function (search/__init__.py)
}

if TYPE_CHECKING:
    from torchloom.api import Trainer, export, process, quantize, train
    from torchloom.core import outputs
    from torchloom.engine.processor import ProcessResult
    from torchloom.engine.run_folder import RunResult


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module = importlib.import_module(_LAZY[name])
        return module if module.__name__.endswith(f".{name}") else getattr(module, name)
    raise AttributeError(f"module 'torchloom' has no attribute '{name}'")


__all__ = [
    "ProcessResult",
    "RunResult",
    "Trainer",
    "__version__",
    "export",
    "outputs",
    "process",
    "quantize",
    "search",
    "train",
]
