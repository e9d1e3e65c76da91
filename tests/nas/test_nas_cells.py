"""DartsCell and DartsFixedCell: one cell as a component, searchable or from a genotype."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torchloom.cli.main import main
from torchloom.engine.architecture_search import Searchable
from torchloom.zoo.nas.cell_components import DartsCell, DartsFixedCell

EDGES = [["sep_conv_3x3", 0], ["skip_connect", 1], ["sep_conv_3x3", 1], ["dil_conv_3x3", 2]]


def test_searchable_cell_and_the_fixed_cell_it_derives() -> None:
    cell = DartsCell.create(input_channels=6, channels=4, steps=2, multiplier=2, reduction=True)
    assert isinstance(cell, DartsCell) and isinstance(cell, Searchable)
    x = torch.randn(2, 6, 8, 8)
    out = cell({"inputs": x, "previous_inputs": x})["outputs"]
    assert out.shape == (2, 8, 4, 4)  # 2 nodes of 4 maps, half the resolution
    assert cell.output_specs()["outputs"].dims[1].size == 8
    with torch.no_grad():
        cell.alpha[:, 4] = 3.0  # sep_conv_3x3 everywhere
    entry = cell.derived_entry()
    assert entry["type"] == "DartsFixedCell" and entry["reduction"] is True
    assert all(op == "sep_conv_3x3" for op, _ in entry["edges"])
    params = {k: v for k, v in entry.items() if k != "type"}
    fixed = DartsFixedCell.create(**params)
    assert fixed({"inputs": x, "previous_inputs": x})["outputs"].shape == (2, 8, 4, 4)


def test_a_cell_searched_with_fewer_outputs_than_nodes_derives_a_cell_of_its_width() -> None:
    cell = DartsCell.create(input_channels=6, channels=4, steps=3, multiplier=2)
    x = torch.randn(2, 6, 8, 8)
    assert cell({"inputs": x, "previous_inputs": x})["outputs"].shape == (2, 8, 8, 8)
    entry = cell.derived_entry()
    assert entry["concat"] == [3, 4]  # the last two of nodes 2, 3, 4
    fixed = DartsFixedCell.create(**{k: v for k, v in entry.items() if k != "type"})
    assert fixed({"inputs": x, "previous_inputs": x})["outputs"].shape == (2, 8, 8, 8)


def test_fixed_cell_after_a_reduction_reads_the_older_input_at_twice_the_size() -> None:
    cell = DartsFixedCell.create(
        input_channels=8,
        previous_channels=6,
        reduction_previous=True,
        channels=4,
        edges=EDGES,
        concat=[2, 3],
        drop_path=0.2,
    )
    out = cell({"inputs": torch.randn(2, 8, 4, 4), "previous_inputs": torch.randn(2, 6, 8, 8)})
    assert out["outputs"].shape == (2, 8, 4, 4)


def test_fixed_cell_errors_name_its_own_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "cell.yml"
    config.write_text(
        """\
pipeline:
  cell:
    type: DartsFixedCell
    input_channels: 8
    channels: 4
    edges: [[sep_conv_3x3, 0], [skip_conect, 1], [sep_conv_3x3, 1], [dil_conv_3x3, 2]]
    concat: [2, 5]
""",
        encoding="utf-8",
    )
    assert main(["check", str(config)]) == 2
    err = capsys.readouterr().err
    assert "cell.yml:6: edges[1]: 'skip_conect' is not a DARTS operation" in err
    assert "did you mean 'skip_connect'" in err
    assert "cell.yml:7: concat[1]: is node 5" in err
