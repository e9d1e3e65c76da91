"""Stream specs: what a component promises about every stream it reads or writes.

A spec gives the dimensions, the element type and a one-line description. Dimensions are
ints (fixed sizes), `-1` (free), or symbolic names such as `batch`, `classes` or `seq_len`
that must agree across the whole graph; `Dim("classes", 10)` names a dimension and fixes its
size at once, which is how a model says "my output dimension is the classes, and it is 10".
Non-tensor streams (a list of strings per batch, say) use a python type as `dtype`: the dims
then describe the nesting of lists, `("batch",)` being one string per sample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

FREE = -1


@dataclass(frozen=True)
class Dim:
    """One dimension: a symbolic name, a fixed size, both, or neither (free)."""

    name: str | None = None
    size: int | None = None

    def __str__(self) -> str:
        if self.name and self.size is not None:
            return f"{self.name}={self.size}"
        if self.name:
            return self.name
        return str(self.size) if self.size is not None else "-1"


DimLike = int | str | Dim
ElementType = torch.dtype | type

# Element-type groups for inputs that accept several dtypes (e.g. any float under autocast).
FLOATING: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
INTEGER: tuple[torch.dtype, ...] = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def to_dim(value: DimLike) -> Dim:
    if isinstance(value, Dim):
        return value
    if isinstance(value, bool):  # bool is an int subclass; a True dimension is a bug
        raise TypeError(f"a dimension cannot be a bool: {value!r}")
    if isinstance(value, int):
        if value == FREE:
            return Dim()
        if value < 0:
            raise ValueError(f"a fixed dimension must be positive or -1, got {value}")
        return Dim(size=value)
    if isinstance(value, str):
        return Dim(name=value)
    raise TypeError(f"a dimension is an int, a name or a Dim, got {value!r}")


def _type_name(t: ElementType) -> str:
    return str(t).replace("torch.", "") if isinstance(t, torch.dtype) else t.__name__


@dataclass(frozen=True, init=False)
class StreamSpec:
    """Dimensions, element type(s) and description of one stream.

    dims=None means "any shape" (a consumer that reads anything, or a producer that cannot
    say). dtype=None means "any element type"; a tuple lists every accepted type.
    """

    dims: tuple[Dim, ...] | None
    dtypes: tuple[ElementType, ...] | None
    description: str = field(default="")

    def __init__(
        self,
        dims: Sequence[DimLike] | None,
        dtype: ElementType | Sequence[ElementType] | None,
        description: str = "",
    ) -> None:
        dims_t = None if dims is None else tuple(to_dim(d) for d in dims)
        dtypes: tuple[ElementType, ...] | None
        if dtype is None:
            dtypes = None
        elif isinstance(dtype, (torch.dtype, type)):
            dtypes = (dtype,)
        else:
            dtypes = tuple(dtype)
        object.__setattr__(self, "dims", dims_t)
        object.__setattr__(self, "dtypes", dtypes)
        object.__setattr__(self, "description", description)

    @property
    def is_tensor(self) -> bool:
        return self.dtypes is not None and all(isinstance(t, torch.dtype) for t in self.dtypes)

    def shape_text(self) -> str:
        if self.dims is None:
            return "[any]"
        return "[" + ", ".join(str(d) for d in self.dims) + "]"

    def dtype_text(self) -> str:
        if self.dtypes is None:
            return "any"
        return "|".join(_type_name(t) for t in self.dtypes)

    def __str__(self) -> str:
        return f"{self.shape_text()} {self.dtype_text()}"

    def with_dim_names(self, names: Mapping[str, str]) -> StreamSpec:
        """The same spec with symbolic dimension names renamed (a config's `dims:` mapping)."""
        if not names or self.dims is None:
            return self
        dims = tuple(
            Dim(names.get(d.name, d.name), d.size) if d.name is not None else d for d in self.dims
        )
        return StreamSpec(dims, self.dtypes, self.description)

    def accepts_dtype_of(self, produced: StreamSpec) -> bool:
        """Whether every element type the producer may emit is one this consumer accepts."""
        if self.dtypes is None or produced.dtypes is None:
            return True
        return all(any(_type_fits(p, c) for c in self.dtypes) for p in produced.dtypes)


def _type_fits(produced: ElementType, accepted: ElementType) -> bool:
    if isinstance(produced, torch.dtype) or isinstance(accepted, torch.dtype):
        return produced == accepted
    return issubclass(produced, accepted)


def describe_value(value: Any) -> str:
    """A short text of what a stream actually carried (used in runtime checks)."""
    if isinstance(value, torch.Tensor):
        return f"tensor{list(value.shape)} {_type_name(value.dtype)}"
    if isinstance(value, list):
        inner = type(value[0]).__name__ if value else "?"
        return f"list[{inner}] of {len(value)}"
    return type(value).__name__
