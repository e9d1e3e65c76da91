"""The registry: entry points, `module:Class`, and refusing anything that is not a Component."""

from __future__ import annotations

import builtins
import os
from pathlib import Path

import pytest

import toy_components
from torchloom.core.component import Component
from torchloom.core.registry import (
    all_components,
    clear_cache,
    missing_methods,
    registered_names,
    resolve,
)
from torchloom.errors import ComponentError


def test_builtins_are_registered_through_entry_points() -> None:
    names = registered_names()
    for expected in ("MNIST", "LeNet5", "NLLLoss", "AccuracyStatistics"):
        assert expected in names
    assert issubclass(resolve("LeNet5"), Component)


def test_unknown_type_suggests_close_names() -> None:
    with pytest.raises(ComponentError, match="did you mean 'LeNet5'"):
        resolve("LeNet", "cfg.yml:3")


def test_module_class_form_resolves_a_component() -> None:
    assert resolve("toy_components:ToyLinear") is toy_components.ToyLinear


@pytest.mark.parametrize(
    "name",
    [
        "os:system",
        "builtins:eval",
        "builtins:exec",
        "subprocess:run",
    ],
)
def test_the_standard_library_is_refused_before_it_is_imported(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ComponentError, match="it is in the standard library"):
        resolve(name, "cfg.yml:1")


def test_a_module_that_acts_when_imported_is_not_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`type: venv.__main__:X` made a whole virtual environment in the working folder, named
    after loom's own arguments, before the type was found wrong."""
    monkeypatch.chdir(tmp_path)
    for name in ("venv.__main__:Anything", "antigravity:Thing", "toy_components.__main__:X"):
        with pytest.raises(ComponentError) as refused:
            resolve(name, "cfg.yml:1")
        assert "standard library" in str(refused.value) or "__main__" in str(refused.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["toy_components:NotAComponent"])
def test_non_components_are_refused_without_being_called(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[object] = []
    monkeypatch.setattr(os, "system", lambda *a: calls.append(a))
    monkeypatch.setattr(builtins, "eval", lambda *a: calls.append(a))
    with pytest.raises(ComponentError, match="not a torchloom Component subclass"):
        resolve(name, "cfg.yml:1")
    assert calls == []
    assert toy_components.NotAComponent.built is False


def test_missing_module_and_attribute() -> None:
    with pytest.raises(ComponentError, match=r"cannot import module 'no_such_pkg\.mod'"):
        resolve("no_such_pkg.mod:Thing")
    with pytest.raises(ComponentError, match="has no attribute 'Missing'"):
        resolve("toy_components:Missing")


@pytest.mark.parametrize("bad", ["", None, 3, ":Class", "module:"])
def test_malformed_types(bad: object) -> None:
    with pytest.raises(ComponentError):
        resolve(bad)


def _plugin(root: Path, dist: str, names: dict[str, str]) -> None:
    info = root / f"{dist}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = "".join(f"{name} = {target}\n" for name, target in names.items())
    (info / "entry_points.txt").write_text(f"[torchloom.components]\n{lines}")


def test_plugins_cannot_shadow_builtins_and_clashes_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _plugin(
        tmp_path,
        "plugin_a",
        {"LeNet5": "toy_components:ToyLinear", "Shared": "toy_components:ToyLinear"},
    )
    _plugin(tmp_path, "plugin_b", {"Shared": "toy_components:Echo"})
    monkeypatch.syspath_prepend(str(tmp_path))
    clear_cache()
    try:
        assert resolve("LeNet5").__module__ == "torchloom.zoo.models.lenet5"
        with pytest.raises(ComponentError, match=r"registered by several packages.*plugin_a"):
            resolve("Shared")
    finally:
        monkeypatch.undo()
        clear_cache()


def test_every_registered_component_implements_what_its_family_needs() -> None:
    # resolve() refuses a class that could not run; none of the built-ins may be one.
    components = all_components()
    assert len(components) > 40
    assert {
        name: missing_methods(cls) for name, cls in components.items() if missing_methods(cls)
    } == {}


def test_the_catalog_reads_every_family_and_description_from_source() -> None:
    # `loom components` lists what the source says, without importing: it must say what
    # importing would.
    from torchloom.core.catalog import summaries
    from torchloom.core.describe import first_line

    read = summaries()
    assert read.keys() == set(registered_names())
    for name, cls in all_components().items():
        assert read[name] is not None, f"{name}: its source does not settle it"
        assert (read[name].family, read[name].description) == (cls.family, first_line(cls)), name


def test_each_package_metadata_is_read_once_however_many_components_a_pipeline_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Naming an entry point's package parses its metadata file: done per lookup, it cost
    # half a second of every run's start for a pipeline of six components.
    from torchloom.core import catalog

    calls: list[str] = []
    real = catalog.distribution
    monkeypatch.setattr(
        catalog, "distribution", lambda entry: calls.append(entry.name) or real(entry)
    )
    clear_cache()
    try:
        for name in ("LeNet5", "NLLLoss", "AccuracyStatistics", "MNIST"):
            resolve(name)
        assert len(calls) == len(set(calls)) == len(registered_names())
    finally:
        clear_cache()


def test_an_allowed_module_is_no_path_to_a_refused_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`torch.hub:tempfile.mkdtemp` reached the standard library through an attribute of an
    allowed module, and a code-first record's factory so named was called by `loom process`
    (a folder made in /tmp; `...extensions:venv.main` made a virtual environment). Neither a
    module reached by attribute nor an object another refused module defines is taken."""
    import tempfile

    from torchloom.core.registry import import_object

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for path in ("torch.hub:tempfile.mkdtemp", "torch.hub:tempfile"):
        with pytest.raises(LookupError, match="is a module"):
            import_object(path)
    import torch.hub

    monkeypatch.setattr(torch.hub, "mkdtemp", tempfile.mkdtemp, raising=False)
    with pytest.raises(LookupError, match="defined in tempfile"):
        import_object("torch.hub:mkdtemp")
    assert list(tmp_path.iterdir()) == []
    assert import_object("toy_components:ToyLinear") is toy_components.ToyLinear
