"""Accuracy per group of samples (question types, categories, ...) over a whole set."""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
from pydantic import Field, field_validator

from torchloom.core.component import Batch, BuildContext, ComponentParams
from torchloom.core.streams import FLOATING, StreamSpec
from torchloom.errors import ComponentError
from torchloom.zoo.pending_counts import CountedLater, PendingColumns

_NAME = re.compile(r"[A-Za-z0-9_]+")


class AccuracyByGroupParams(ComponentParams):
    group_names: list[str] | None = Field(
        None,
        min_length=1,
        description="Name of every group, in the order of the `groups` values: value 0 is "
        "the first name; each becomes a statistic <prefix>_<name>. Letters, digits and _. "
        "null: read them from the global `group_names` (e.g. a task's question_type_names).",
    )
    prefix: str = Field(
        "accuracy",
        pattern=r"^[A-Za-z][A-Za-z0-9_]*$",
        description="Name of the overall accuracy, and prefix of the per-group ones.",
    )
    ignore_index: int | None = Field(
        -100,
        description="Target value left out of every count (the losses' default too); null "
        "counts every target.",
    )

    @field_validator("group_names")
    @classmethod
    def _names_usable_as_columns(cls, names: list[str] | None) -> list[str] | None:
        problem = None if names is None else group_names_problem(names)
        if problem:
            raise ValueError(problem)
        return names


def group_names_problem(names: list[str]) -> str | None:
    """What makes these unusable as group names, or None: they become CSV columns and
    monitor names (validation.accuracy_relational)."""
    for name in names:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            return f"'{name}' must be letters, digits and _ only"
    if len(set(names)) != len(names):
        return f"{names} names a group twice"
    if not names:
        return "there must be at least one group"
    return None


class AccuracyByGroupStatistics(CountedLater):
    """Accuracy over a whole set, overall and per group of samples: e.g. relational and
    non-relational questions of Sort-of-CLEVR, or the categories of VQA-Med.

    Reads `predictions` (scores [batch, classes]: the highest-scoring class is the
    prediction), `targets` (int64 class index) and `groups` (int64 group index per sample,
    0 to len(group_names) - 1). Correct and counted samples are summed per group across the
    batches of the set, and divided only in `compute()`, which reports `<prefix>` (every
    counted sample) and `<prefix>_<group name>` for every group; a group with no samples
    gives NaN. A sample whose group is outside the names counts in the overall accuracy
    only; a target equal to `ignore_index` counts nowhere.

    The names are the `group_names` parameter, or else the global `group_names`, which a
    config maps to a task's list (SortOfCLEVR publishes `question_type_names`).

    ```yaml
    pipeline:
      accuracy:
        type: AccuracyByGroupStatistics
        streams: {groups: question_types}
        globals: {group_names: question_type_names}   # or: group_names: [non_rel, rel]
    ```
    Reports `accuracy`, `accuracy_non_relational` and `accuracy_relational`.
    """

    Params = AccuracyByGroupParams
    params: AccuracyByGroupParams
    correct: torch.Tensor
    total: torch.Tensor
    EXAMPLE_GLOBALS = {"group_names": ["non_relational", "relational"]}

    @classmethod
    def needed_globals(cls, params: ComponentParams) -> Mapping[str, str]:
        assert isinstance(params, AccuracyByGroupParams)
        if params.group_names is not None:
            return {}
        return {"group_names": "name of every group, in the order of the `groups` values"}

    def __init__(self, params: AccuracyByGroupParams, context: BuildContext) -> None:
        super().__init__(params, context)
        names = params.group_names
        if names is None:
            names = self.global_value("group_names")
            problem = (
                group_names_problem(names)
                if isinstance(names, list)
                else f"is {names!r}, not a list of names"
            )
            if problem:
                raise ComponentError.at(
                    self.where("globals"),
                    self.label,
                    f"the global group_names {problem}",
                    "map `group_names` to a global holding a list of names, or set "
                    "the group_names parameter",
                )
        self.group_names: list[str] = list(names)
        groups = len(self.group_names)
        # Index `groups` collects the samples of unnamed groups. Buffers follow the pipeline to
        # its device and into checkpoints, so a resumed run continues the same counts.
        self.register_buffer("correct", torch.zeros(groups + 1, dtype=torch.int64))
        self.register_buffer("total", torch.zeros(groups + 1, dtype=torch.int64))
        # The steps not yet counted: argmax, targets and groups (zoo/pending_counts.py).
        self._pending = PendingColumns(3)

    def input_specs(self) -> dict[str, StreamSpec]:
        return {
            "predictions": StreamSpec(("batch", "classes"), FLOATING, "class scores per sample"),
            "targets": StreamSpec(("batch",), torch.int64, "class index per sample"),
            "groups": StreamSpec(("batch",), torch.int64, "group index per sample"),
        }

    def update(self, inputs: Batch) -> None:
        # Every training step: three copies, counted later (zoo/pending_counts.py).
        targets = inputs["targets"]
        chosen, goals, groups = self._pending.reserve(
            len(targets), targets.device, self.count_pending
        )
        goals.copy_(targets)
        groups.copy_(inputs["groups"])
        torch.argmax(inputs["predictions"], dim=1, out=chosen)

    def count_pending(self) -> None:
        pending = self._pending.take()
        if pending is None:
            return
        chosen, targets, groups = pending
        named = len(self.group_names)
        # Slots: the named groups, then `named` for unnamed groups, then `named + 1` for
        # ignored targets (dropped). torch.where and index_add_ into a buffer of fixed size,
        # not boolean indexing or torch.bincount (which reads the input's range back to the
        # host), so that counting never waits for the device; index_add_ is also
        # deterministic on CUDA, where a weighted bincount is not.
        slots = torch.where((groups >= 0) & (groups < named), groups, named)
        if self.params.ignore_index is not None:
            slots = torch.where(targets == self.params.ignore_index, named + 1, slots)
        hits = (chosen == targets).long()
        counts = torch.zeros(named + 2, 2, dtype=torch.int64, device=slots.device)
        counts.index_add_(0, slots, torch.stack((torch.ones_like(slots), hits), dim=1))
        self.total += counts[: named + 1, 0].to(self.total.device)
        self.correct += counts[: named + 1, 1].to(self.correct.device)

    def compute(self) -> dict[str, float]:
        self.count_pending()
        correct = self.correct.detach().cpu().double()
        total = self.total.detach().cpu().double()
        prefix = self.params.prefix

        def ratio(hits: torch.Tensor, count: torch.Tensor) -> float:
            return float(hits / count) if count > 0 else float("nan")

        values = {prefix: ratio(correct.sum(), total.sum())}
        for index, name in enumerate(self.group_names):
            values[f"{prefix}_{name}"] = ratio(correct[index], total[index])
        return values

    def reset(self) -> None:
        self._pending.clear()
        self.correct.zero_()
        self.total.zero_()
