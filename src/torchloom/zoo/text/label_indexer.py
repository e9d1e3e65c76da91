"""Labels <-> class indices (`LabelIndexer`), with a label set given, published by the task, or
built from the training data. Built once, when the pipeline is built, and shared by every
section; written into the run folder and every checkpoint, and a checkpoint whose label set
differs from the one built is refused (its weights would mean other classes).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import torch
from pydantic import Field

from torchloom.core.component import Batch, BuildContext, Component, ComponentParams
from torchloom.core.host_copies import host_to_device
from torchloom.core.streams import INTEGER, StreamSpec
from torchloom.zoo.text.fitting import fit_error, refuse_other_entries, training_values
from torchloom.zoo.text.vocabulary import (
    UNK,
    escape_word,
)


class LabelIndexerParams(ComponentParams):
    labels: list[str] | None = Field(
        None, min_length=1, description="The labels, in class-index order; null: see below."
    )
    from_global: bool = Field(
        False,
        description="Take the labels from the global `label_word_mappings` (label -> index, "
        "as tasks publish it; rename with `globals:`) instead of building them.",
    )
    build_from: str = Field(
        "labels",
        description="Training-task stream whose distinct values, sorted, are the labels, when "
        "neither `labels` nor `from_global` is given.",
    )
    ignore_index: int = Field(
        -100, description="Target of a label outside the label set (losses skip it)."
    )
    reverse: bool = Field(
        False, description="Reverse direction: `targets` (class indices) -> `labels`."
    )
    unknown_label: str = Field(
        UNK, description="Label written for an index outside the label set, in reverse mode."
    )


class LabelIndexer(Component):
    """Turns label words into class indices (`targets`), and back (`reverse: true`).

    The label set is `labels`, or the global `label_word_mappings` (`from_global: true`), or
    the distinct values of the training task's `build_from` stream sorted alphabetically. A
    label outside the set becomes `ignore_index` (-100, which NLLLoss/CrossEntropyLoss skip).
    The labels are written to `<run>/artifacts/<name>/labels.txt` and saved in checkpoints.

    Streams: `labels` (one label per sample) -> `targets` (int64 [batch]); reverse: `targets`
    -> `labels`. Publishes `num_classes` and `label_mappings` (label -> index).

    ```yaml
    pipeline:
      label_indexer: {type: LabelIndexer, labels: [business, entertainment, politics]}
      # or from the task's global, under another name for the number of classes:
      # label_indexer:
      #   {type: LabelIndexer, from_global: true, globals: {num_classes: label_count}}
    ```
    """

    Params = LabelIndexerParams
    params: LabelIndexerParams
    _device_probe: torch.Tensor
    PUBLISHES_GLOBALS = {
        "num_classes": "number of labels",
        "label_mappings": "label -> class index",
    }

    @classmethod
    def needed_globals(cls, params: Any) -> Mapping[str, str]:
        if params.from_global:
            return {"label_word_mappings": "label -> class index"}
        return {}

    def __init__(self, params: LabelIndexerParams, context: BuildContext) -> None:
        super().__init__(params, context)
        if params.labels is not None and params.from_global:
            raise fit_error(self, "from_global", "`labels` and `from_global` both give the labels")
        if params.labels is not None:
            labels = list(params.labels)
        elif params.from_global:
            labels = self._from_global(self.global_value("label_word_mappings"))
        else:
            labels = self._build()
        duplicates = sorted(label for label, n in Counter(labels).items() if n > 1)
        if duplicates:
            raise fit_error(self, "labels", f"labels listed twice: {duplicates}")
        self.labels: tuple[str, ...] = tuple(labels)
        self.mappings = {label: index for index, label in enumerate(self.labels)}
        self.register_buffer("_device_probe", torch.zeros(0), persistent=False)
        self.publish_global("num_classes", len(self.labels))
        self.publish_global("label_mappings", dict(self.mappings))

    def _from_global(self, mappings: Any) -> list[str]:
        if not isinstance(mappings, Mapping) or sorted(mappings.values()) != list(
            range(len(mappings))
        ):
            raise fit_error(
                self,
                "globals",
                "global 'label_word_mappings' is not a label -> index mapping with the "
                "indices 0..n-1",
            )
        return [str(label) for label, _ in sorted(mappings.items(), key=lambda item: item[1])]

    def _build(self) -> list[str]:
        values = set()
        otherwise = "give the labels with `labels: [...]` or `from_global: true`"
        for value in training_values(self, self.params.build_from, "build_from", otherwise):
            if not isinstance(value, str):
                raise fit_error(
                    self,
                    "build_from",
                    f"training stream '{self.params.build_from}' holds "
                    f"{type(value).__name__} values, not label words",
                )
            values.add(value)
        if not values:
            raise fit_error(
                self,
                "build_from",
                f"the training stream '{self.params.build_from}' holds no labels",
                "give the labels with `labels: [...]`",
            )
        return sorted(values)

    def artifacts(self) -> Mapping[str, str]:
        return {"labels.txt": "".join(escape_word(label) + "\n" for label in self.labels)}

    def get_extra_state(self) -> dict[str, Any]:
        return {"labels": list(self.labels)}

    def set_extra_state(self, state: Any) -> None:
        saved = tuple(state.get("labels", ())) if isinstance(state, Mapping) else ()
        if saved != self.labels:
            raise refuse_other_entries(self, "labels", saved, self.labels)

    def input_specs(self) -> dict[str, StreamSpec]:
        if self.params.reverse:
            return {"targets": StreamSpec(("batch",), INTEGER, "class index of each sample")}
        return {"labels": StreamSpec(("batch",), str, "label of each sample")}

    def output_specs(self) -> dict[str, StreamSpec]:
        if self.params.reverse:
            return {"labels": StreamSpec(("batch",), str, "label of each sample")}
        return {
            "targets": StreamSpec(
                ("batch",), torch.int64, f"class index ({self.params.ignore_index}: unknown)"
            )
        }

    def forward(self, inputs: Batch) -> Batch:
        if self.params.reverse:
            count = len(self.labels)
            return {
                "labels": [
                    self.labels[i] if 0 <= i < count else self.params.unknown_label
                    for i in inputs["targets"].tolist()
                ]
            }
        targets = [self.mappings.get(label, self.params.ignore_index) for label in inputs["labels"]]
        host = torch.tensor(targets, dtype=torch.int64)  # pinned on its way, as the indexer's
        return {"targets": host_to_device(host, self._device_probe.device)}
