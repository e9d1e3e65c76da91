"""Schema of `training.architecture_search`: DARTS's bi-level search as a training mode.

    training:
      architecture_search: {order: second, split: 0.5, arch_optimizer: {type: Adam, lr: 3.0e-4}}

The engine's part is engine/architecture_search.py. Like the rest of the config package this
module never imports torch.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from torchloom.config_model import ConfigModel


class ArchitectureOptimizerConfig(ConfigModel):
    """`type` names a torch.optim class; every other key is passed to it (checked there).
    The defaults are the paper's: Adam, lr 3e-4, betas (0.5, 0.999), weight decay 1e-3."""

    model_config = ConfigDict(extra="allow", defer_build=True)
    type: str = Field("Adam", description="torch.optim class name for the architecture parameters")


PAPER_ARCH_OPTIMIZER = {"lr": 3.0e-4, "betas": [0.5, 0.999], "weight_decay": 1.0e-3}


class ArchitectureSearchConfig(ConfigModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    order: Literal["first", "second"] = Field(
        "first",
        description="first: the architecture gradient at the current weights; second: "
        "through one virtual weight step (the paper's unrolled hypergradient)",
    )
    split: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="share of the training set that trains the weights; the rest trains the "
        "architecture parameters",
    )
    split_seed: int = Field(0, description="seed of the weights/architecture split of the set")
    arch_optimizer: ArchitectureOptimizerConfig = Field(
        default_factory=lambda: ArchitectureOptimizerConfig(type="Adam", **PAPER_ARCH_OPTIMIZER),
        description="optimizer of the architecture parameters (default: the paper's Adam)",
    )
    epsilon: float = Field(
        0.01,
        gt=0,
        allow_inf_nan=False,
        description="second order: the finite-difference step is epsilon / ||grad_w' L_val||",
    )
    derived: dict[str, Any] = Field(
        default_factory=dict,
        description="parameters of the derived network in derived.yml that differ from the "
        "searched one, e.g. {cells: 20, channels: 36, auxiliary: true}",
    )
