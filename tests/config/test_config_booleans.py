"""A YAML boolean where a number is expected is an error (config_model.ConfigModel): pydantic's
lax mode read `true` as 1 and `false` as 0, so `batch_size: true` trained with batches of one
and `hidden_sizes: [true, 20]` built a layer of one unit, without a word."""

from __future__ import annotations

import importlib
import pkgutil
import typing
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ValidationError

import torchloom.analysis
import torchloom.config
import torchloom.search
import torchloom.zoo
from torchloom.cli.main import main
from torchloom.config import sampler_schema
from torchloom.config_model import ConfigModel, boolean_for_a_number
from torchloom.core.component import ComponentParams


def _check(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> str:
    config = tmp_path / "bad.yml"
    config.write_text("default_configs: [loom://mnist/ffn.yml]\n" + text)
    assert main(["check", str(config)]) == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        (
            "training:\n  dataloader: {batch_size: true}\n",
            3,
            "key 'training.dataloader.batch_size'",
        ),
        ("training:\n  terminal_conditions: {epoch_limit: false}\n", 3, "epoch_limit"),
        (
            "training:\n  sampler: {type: subset, fraction: 0.5, split_seed: true}\n",
            3,
            "split_seed",
        ),
        ("pipeline:\n  classifier: {hidden_sizes: [true, 20]}\n", 3, "parameter 'hidden_sizes'"),
        ("pipeline:\n  classifier: {dropout: false}\n", 3, "parameter 'dropout'"),
    ],
)
def test_a_boolean_for_a_number_is_refused_at_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, line: int, key: str
) -> None:
    error = _check(tmp_path, text, capsys)
    assert f"bad.yml:{line}:" in error and key in error
    assert "not a boolean" in error


class _Params(ComponentParams):
    flag: bool = True
    size: int = 1
    rate: float = 0.5
    maybe: int | None = None
    either: int | bool = 0
    anything: Any = None
    sizes: list[int] = []
    table: dict[str, float] = {}
    mode: Literal[0, 1, "auto"] = "auto"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("size", True),
        ("rate", False),
        ("maybe", True),
        ("sizes", [3, True]),
        ("table", {"a": True}),
        ("mode", True),
    ],
)
def test_number_fields_refuse_booleans(key: str, value: object) -> None:
    with pytest.raises(ValidationError, match="not a boolean"):
        _Params(**{key: value})


def test_what_takes_a_boolean_still_does_and_numbers_still_convert() -> None:
    params = _Params(flag=False, either=True, anything=True, rate=2, sizes=[1, 2])
    assert params.flag is False and params.either is True and params.anything is True
    assert params.rate == 2.0 and isinstance(params.rate, float) and params.sizes == [1, 2]


def test_the_samplers_name_every_number_field_they_have() -> None:
    """The sampler schemas cannot take ConfigModel's every-field validator (pydantic refuses
    it on the union's tag), so they list their number fields: every one must be listed."""
    union = typing.get_args(typing.get_args(sampler_schema.SamplerConfig)[0])
    assert len(union) >= 4
    numbers = {
        name
        for member in union
        for name, field in member.model_fields.items()
        if boolean_for_a_number(field.annotation, True)
        or boolean_for_a_number(field.annotation, [True])
    }
    assert numbers == set(sampler_schema.NUMBER_FIELDS)


def test_every_config_schema_refuses_booleans_for_numbers() -> None:
    """Each pydantic model of torchloom either derives from ConfigModel or is a sampler."""
    for package in (torchloom.zoo, torchloom.config, torchloom.analysis, torchloom.search):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            importlib.import_module(module.name)  # every schema defined

    def every(cls: type) -> list[type]:
        return [cls, *(c for sub in cls.__subclasses__() for c in every(sub))]

    ours = [cls for cls in every(BaseModel) if cls.__module__.startswith("torchloom.")]
    assert len(ours) > 100  # the components' parameters among them
    outside = [
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in ours
        if not issubclass(cls, (ConfigModel, sampler_schema._Strict))
    ]
    assert outside == []


def test_a_scheduler_argument_without_a_default_refuses_a_boolean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """torch's own arguments are checked by their defaults; StepLR's `step_size` has none, so
    `step_size: true` stepped the rate every epoch. Its annotation (int) says it is a number."""
    error = _check(tmp_path, "training:\n  scheduler: {type: StepLR, step_size: true}\n", capsys)
    assert "bad.yml:3:" in error and "training.scheduler.step_size: expected a number" in error
