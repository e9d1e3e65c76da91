"""The first batch of a pass, checked against what every component declared.

The handshake checks the graph from the declared specs before any data is read; this checks
that the components keep their word when data flows: on the first batch of each section,
every stream a task or component returns is compared with its spec (keys, rank, fixed and
symbolic sizes, element type), so a plugin that returns `preds` instead of `predictions`, or
12 classes where it declared 10, is named here instead of failing deep inside another
component. Later batches are not checked: nothing here runs per step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from torchloom.core.component import Batch, Component
from torchloom.core.streams import FLOATING, StreamSpec, describe_value
from torchloom.errors import ComponentError, Problem


class FirstBatchCheck:
    """Symbolic sizes seen so far in one batch, and the check of each producer's streams."""

    def __init__(self, section: str, known_sizes: Mapping[str, int]) -> None:
        self.section = section
        self.sizes: dict[str, tuple[int, str]] = {
            name: (size, "the task's declared sizes") for name, size in known_sizes.items()
        }

    def check(self, producer: Component, returned: Mapping[str, Any]) -> None:
        """Raise a ComponentError naming `producer` if what it returned breaks its specs."""
        declared = producer.pipeline_specs(producer.output_specs())
        label = f"[{self.section}] {producer.label}"
        problems = []
        for key in declared:
            if key not in returned:
                problems.append(
                    f"did not return stream '{key}', which it declares "
                    f"(it returned: {', '.join(map(str, returned)) or 'nothing'})"
                )
        for key, value in returned.items():
            if key not in declared:
                problems.append(
                    f"returned stream '{key}', which it does not declare "
                    f"(it declares: {', '.join(declared) or 'none'})"
                )
            else:
                problems += self._value_problems(key, declared[key], value, producer.label)
        if problems:
            raise ComponentError(
                [
                    Problem(
                        producer.where(),
                        label,
                        f"on the first batch, {message}",
                        "its output_specs() and forward() disagree: fix the component",
                    )
                    for message in problems
                ]
            )

    def _value_problems(self, key: str, spec: StreamSpec, value: Any, origin: str) -> list[str]:
        stream = f"stream '{key}'"
        if not spec.is_tensor:
            if spec.dtypes is not None and spec.dims and not isinstance(value, list | tuple):
                return [f"{stream} is {describe_value(value)}, but it declares a list {spec}"]
            return []
        if not isinstance(value, torch.Tensor):
            return [f"{stream} is {describe_value(value)}, but it declares a tensor {spec}"]
        problems = []
        if spec.dtypes is not None and not _dtype_fits(value.dtype, spec.dtypes):
            problems.append(
                f"{stream} has element type {str(value.dtype).replace('torch.', '')}, "
                f"but it declares {spec.dtype_text()}"
            )
        if spec.dims is None:
            return problems
        if value.dim() != len(spec.dims):
            return [
                *problems,
                f"{stream} has shape {list(value.shape)} (rank {value.dim()}), "
                f"but it declares {spec.shape_text()} (rank {len(spec.dims)})",
            ]
        for axis, (dim, size) in enumerate(zip(spec.dims, value.shape, strict=True)):
            if dim.size is not None and dim.size != size:
                problems.append(
                    f"{stream} has size {size} in dimension {axis}"
                    f"{f' ({dim.name!r})' if dim.name else ''}, but it declares "
                    f"{dim.size} ({spec.shape_text()}, shape {list(value.shape)})"
                )
            elif dim.name is not None:
                known = self.sizes.setdefault(dim.name, (size, f"{stream} of {origin}"))
                if known[0] != size:
                    problems.append(
                        f"{stream} has size {size} in dimension {axis} ('{dim.name}'), but "
                        f"'{dim.name}' is {known[0]} in {known[1]} (shape {list(value.shape)})"
                    )
        return problems


def _dtype_fits(dtype: torch.dtype, declared: tuple[Any, ...]) -> bool:
    if dtype in declared:
        return True
    # Under autocast a float32 layer may return float16/bfloat16 (and the reverse).
    return dtype in FLOATING and any(d in FLOATING for d in declared)


def check_task_batch(check: FirstBatchCheck, task: Component, batch: Batch) -> None:
    """The task's streams in a batch (keyed by pipeline-wide names) against its specs."""
    names = {task.stream_name(key): key for key in task.output_specs()}
    check.check(task, {names.get(name, name): value for name, value in batch.items()})
