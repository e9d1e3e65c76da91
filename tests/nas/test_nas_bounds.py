"""A DARTS config from someone else cannot ask for modules without end (modules grow as
cells x steps^2 x operations): `loom check` refused nothing, then ran a minute into a bare
MemoryError or std::bad_alloc. Also the search's settings that are numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_nas_search import search_config

from torchloom.cli.main import main
from torchloom.zoo.nas.genotype import Genotype, genotype_problems


@pytest.mark.parametrize(
    ("override", "bound"),
    [
        ("pipeline.image_classifier.cells=200000", "100"),
        ("pipeline.image_classifier.steps=2000", "12"),
        ("pipeline.image_classifier.channels=100000", "1024"),
        ("+training.architecture_search.derived.cells=1000000000", "100"),
    ],
    ids=["cells", "steps", "channels", "derived-cells"],
)
def test_sizes_beyond_any_darts_network_are_refused_by_loom_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, bound: str
) -> None:
    assert main(["check", str(search_config(tmp_path)), override]) == 2
    error = capsys.readouterr().err
    key = override.split("=")[0].rsplit(".", 1)[1]
    assert key in error and f"less than or equal to {bound}" in error


def test_a_genotype_output_joins_each_node_once() -> None:
    """[2, 2, 2, ...] multiplied the cell's maps by the number of repeats."""
    edges = [("sep_conv_3x3", 0), ("skip_connect", 1)]
    genotype = Genotype(normal=edges, normal_concat=[2, 2], reduce=edges, reduce_concat=[2])
    problems = genotype_problems(genotype, lambda *keys: "g.yml", ("genotype",))
    assert [p.subject for p in problems] == ["genotype.normal_concat[1]"]
    assert "is node 2 again" in problems[0].message


def test_an_infinite_finite_difference_step_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It passed `loom check`, then every step diverged and blamed the learning rate."""
    config = str(search_config(tmp_path, order="second"))
    assert main(["check", config, "+training.architecture_search.epsilon=.inf"]) == 2
    assert "epsilon" in capsys.readouterr().err


def test_setting_a_key_of_a_section_left_to_its_default_says_how(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said "has no key 'arch_optimizer' (did you mean 'arch_optimizer'?)"."""
    config = str(search_config(tmp_path))
    assert main(["check", config, "training.architecture_search.arch_optimizer.lr=0.1"]) == 2
    error = capsys.readouterr().err
    assert "did you mean" not in error
    assert "'training.architecture_search.arch_optimizer' is not in the config" in error
    assert "'+training.architecture_search.arch_optimizer.lr=0.1'" in error
