"""Components that write streams to files during evaluation passes (`loom process`)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import IO, Any

import torch
from pydantic import Field

from torchloom.core.component import Batch, BuildContext, Component, ComponentParams
from torchloom.core.file_names import OwnFileName
from torchloom.core.streams import StreamSpec
from torchloom.data.csv_cells import safe_cells


class StreamFileExporterParams(ComponentParams):
    input_streams: list[str] = Field(
        min_length=1, description="streams to write, one column each (pipeline-wide names)"
    )
    filename: OwnFileName = Field(
        "exported_streams.csv",
        description="file name inside the pass folder (no path; not one of the folder's own "
        "files: config.yaml, summary.json, run.log, test_statistics.csv, test_summary.json, ...)",
    )
    separator: str = Field(",", min_length=1, max_length=1, description="CSV field separator")
    sections: list[str] = Field(
        default_factory=lambda: ["validation", "test"],
        description="passes that export (a training run's own batches are section 'training')",
    )


def _cell(value: Any, of_a_tensor: bool) -> str:
    """A sample's value as text: a tensor's values space-separated (a tensor stream reaches
    here as nested lists, `of_a_tensor`), anything else as Python writes it."""
    if isinstance(value, torch.Tensor):  # a sample's tensor in a list stream
        value, of_a_tensor = value.tolist(), True
    if of_a_tensor and isinstance(value, list):
        return " ".join(_cell(v, True) for v in value)
    return str(value)


class StreamFileExporter(Component):
    """Writes chosen streams per sample to a CSV file, e.g. predicted answers for a
    competition submission. Active in the passes of `loom process` whose section is listed
    in `sections` (validation and test by default), where the worker gives it the pass
    folder; tensors are written one row per sample (vectors as space-separated values).

    ```yaml
    pipeline:
      exporter:
        type: StreamFileExporter
        input_streams: [indices, predicted_labels]
        filename: submission.csv
    ```
    """

    Params = StreamFileExporterParams
    params: StreamFileExporterParams

    def __init__(self, params: StreamFileExporterParams, context: BuildContext) -> None:
        super().__init__(params, context)
        self._handle: IO[str] | None = None
        self._writer: Any = None
        self.path: Path | None = None

    def input_specs(self) -> dict[str, StreamSpec]:
        # Reads the named streams whatever they are; the names are pipeline-wide already.
        return {
            name: StreamSpec(None, None, "a stream to export") for name in self.params.input_streams
        }

    def begin_pass(self, section: str, folder: Path) -> None:
        if section not in self.params.sections:
            return
        self.path = folder / self.params.filename
        self._handle = open(self.path, "w", newline="", encoding="utf-8")  # noqa: SIM115
        self._writer = csv.writer(self._handle, delimiter=self.params.separator)
        self._writer.writerow(self.params.input_streams)

    def forward(self, inputs: Batch) -> Batch:
        if self._writer is None:
            return {}
        # Each tensor read back once a batch: sample by sample, each .item() or .tolist()
        # would wait for a GPU.
        values = [inputs[name] for name in self.params.input_streams]
        tensors = [isinstance(value, torch.Tensor) for value in values]
        columns = [v.detach().tolist() if t else v for v, t in zip(values, tensors, strict=True)]
        for row in zip(*columns, strict=True):
            cells = [_cell(v, t) for v, t in zip(row, tensors, strict=True)]
            self._writer.writerow(safe_cells(cells))  # streams of text: the data's own
        return {}

    def end_pass(self) -> None:
        if self._handle is not None:
            self._handle.close()
        self._handle, self._writer = None, None
