"""Choosing the device: `--device cpu|cuda|cuda:N`, cuda by default when there is one."""

from __future__ import annotations

import torch

from torchloom.errors import ConfigError, Problem


def resolve_device(name: str | None) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ConfigError(
            [Problem("command line", f"--device '{name}'", str(error), "use cpu, cuda or cuda:N")]
        ) from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            [
                Problem(
                    "command line",
                    f"--device '{name}'",
                    "CUDA is not available on this machine",
                    "use --device cpu",
                )
            ]
        )
    if (
        device.type == "cuda"
        and device.index is not None
        and (device.index >= torch.cuda.device_count())
    ):
        raise ConfigError(
            [
                Problem(
                    "command line",
                    f"--device '{name}'",
                    f"only {torch.cuda.device_count()} CUDA device(s) exist",
                )
            ]
        )
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(
            [
                Problem(
                    "command line",
                    f"--device '{name}'",
                    "unsupported device type",
                    "use cpu, cuda or cuda:N",
                )
            ]
        )
    return device
