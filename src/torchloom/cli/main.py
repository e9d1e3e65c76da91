"""The `loom` command. Parsing only: subcommand modules (which import torch) load on dispatch,
so `loom --help` stays fast and never imports torch.

Exit status: 0 success, 2 a user error (printed plainly; `--debug` adds the traceback),
1 an internal bug (with its traceback).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from collections.abc import Sequence

# subcommand -> (module under torchloom.cli, one-line help)
SUBCOMMANDS = {
    "check": ("check", "build a pipeline, run the handshake and print the pipeline table"),
    "config": ("config_cmd", "print the merged, resolved config as YAML"),
    "components": ("components", "list registered components, or describe one"),
    "train": ("train", "train a pipeline (offline or online); --resume continues a run"),
    "process": ("process", "one pass over a section in eval mode, with a run's weights"),
}


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="pipeline config (YAML)")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="OVERRIDE",
        help="Hydra-style overrides: a.b=v, +a.b=v (add), ~a.b (delete)",
    )
    parser.add_argument(
        "--disable",
        default="",
        metavar="A,B",
        help="comma-separated components to leave out of the pipeline",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loom",
        description="torchloom: YAML pipelines of PyTorch components for vision and language.",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of user errors too"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    check = sub.add_parser("check", help=SUBCOMMANDS["check"][1])
    _add_config_arguments(check)
    config = sub.add_parser("config", help=SUBCOMMANDS["config"][1])
    config.add_argument("config", help="pipeline config (YAML)")
    config.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="Hydra-style overrides")
    train = sub.add_parser("train", help=SUBCOMMANDS["train"][1])
    # Declared here, not in cli/train.py, so that `loom --help` imports no torch.
    train.add_argument("config", nargs="?", help="pipeline config (YAML)")
    train.add_argument(
        "overrides",
        nargs="*",
        metavar="OVERRIDE",
        help="Hydra-style overrides: a.b=v, +a.b=v (add), ~a.b (delete)",
    )
    train.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last.pt")
    train.add_argument("--expdir", default="runs", help="parent folder of run folders")
    train.add_argument("--tag", default="", help="suffix of the run folder's name")
    train.add_argument(
        "--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)"
    )
    train.add_argument(
        "--disable", default="", metavar="A,B", help="comma-separated components to leave out"
    )
    train.add_argument(
        "--tensorboard",
        type=int,
        choices=(0, 1, 2),
        default=1,
        help="0 off, 1 scalars, 2 scalars + weight/gradient histograms",
    )
    train.add_argument("--quiet", action="store_true", help="no progress bar or console log")
    process = sub.add_parser("process", help=SUBCOMMANDS["process"][1])
    process.add_argument("source", metavar="CONFIG|RUN_DIR", help="a config, or a run folder")
    process.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="Hydra-style overrides")
    process.add_argument("--section", default="test", help="training, validation or test")
    process.add_argument(
        "--checkpoint",
        default=None,
        metavar="best|last|PATH",
        help="weights to use (default: the run's best.pt)",
    )
    process.add_argument("--expdir", default="runs", help="parent of a new run folder (CONFIG)")
    process.add_argument("--device", default=None, help="cpu, cuda or cuda:N")
    process.add_argument("--disable", default="", metavar="A,B", help="components to leave out")
    components = sub.add_parser("components", help=SUBCOMMANDS["components"][1])
    components.add_argument("name", nargs="?", help="a component type to describe")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module = importlib.import_module(f"torchloom.cli.{SUBCOMMANDS[args.command][0]}")
    from torchloom.errors import LoomError  # light: no torch

    try:
        return int(module.run(args))
    except LoomError as error:
        if args.debug:
            traceback.print_exc()
        print(error.format(), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
