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
}


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="pipeline config (YAML)")
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                        help="Hydra-style overrides: a.b=v, +a.b=v (add), ~a.b (delete)")
    parser.add_argument("--disable", default="", metavar="A,B",
                        help="comma-separated components to leave out of the pipeline")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loom",
        description="torchloom: YAML pipelines of PyTorch components for vision and language.",
    )
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of user errors too")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    check = sub.add_parser("check", help=SUBCOMMANDS["check"][1])
    _add_config_arguments(check)
    config = sub.add_parser("config", help=SUBCOMMANDS["config"][1])
    config.add_argument("config", help="pipeline config (YAML)")
    config.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="Hydra-style overrides")
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
