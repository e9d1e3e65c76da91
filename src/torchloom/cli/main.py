"""The `loom` command. Parsing only: subcommand modules (which import torch) load on dispatch,
so `loom --help` stays fast and never imports torch.

Exit status: 0 success, 2 a user error (printed plainly; `--debug` adds the traceback),
1 an internal bug (with its traceback), 130 a training run stopped by Ctrl-C, 141 (128 +
SIGPIPE) when the reader of stdout went away (`loom runs | head -2`), quietly.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import signal
import sys
import traceback
from collections.abc import Sequence

from torchloom.cli.arguments import ARGUMENTS, SUBCOMMANDS
from torchloom.host_memory import prefer_huge_page_tensors
from torchloom.signals import stop_asked, stopping_on_signals


class _DefaultsShown(argparse.HelpFormatter):
    """Each option's help ends with its default (`--expdir ... (default: runs)`), unless it
    has none (None, empty), is a flag, or its help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        nothing = default is None or default is False or default is argparse.SUPPRESS
        if nothing or default in ("", []) or "default" in text or not text:
            return action.help
        # A positional's default is what leaving it out means; a flag's (store_true, _false,
        # _const: `--static-batch`'s True) is the state another flag's help describes.
        if not action.option_strings or action.nargs == 0:
            return action.help
        return f"{text} (default: %(default)s)"


def command_parser(command: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"loom {command}",
        description=SUBCOMMANDS[command][1],
        formatter_class=_DefaultsShown,
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of user errors")
    ARGUMENTS[command](parser)
    return parser


def build_parser() -> argparse.ArgumentParser:
    listing = "\n".join(f"  {name:<12} {text}" for name, (_, text) in SUBCOMMANDS.items())
    parser = argparse.ArgumentParser(
        prog="loom",
        description="torchloom: YAML pipelines of PyTorch components for vision and language.",
        epilog=f"commands:\n{listing}\n\n`loom COMMAND --help` describes one.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of user errors")
    parser.add_argument("command", choices=list(SUBCOMMANDS), metavar="COMMAND")
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = build_parser()
    given = sys.argv[1:] if argv is None else list(argv)
    if all(argument == "--debug" for argument in given):  # argparse would also want "arguments"
        parser.error(f"a COMMAND is required, one of: {', '.join(SUBCOMMANDS)}")
    top = parser.parse_args(given)
    # Subparsers cannot mix options and positionals (`check cfg --disable x a.b=1`); a
    # command's own parser can.
    args = command_parser(top.command).parse_intermixed_args(top.arguments)
    args.command, args.debug = top.command, top.debug or args.debug
    return args


# OS errors that are the machine's state, not a bug: a full disk, a read-only folder.
STORAGE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT, errno.EFBIG}


def main(argv: Sequence[str] | None = None) -> int:
    """Run `loom ARGV` and return its exit status. With `argv` None this is the `loom`
    program (the console script and `python -m torchloom.cli.main`), which also sets up its
    own exit; with a list (tests, notebooks) nothing global is touched."""
    program = argv is None
    try:
        try:
            status = _dispatch(argv)
        finally:  # a reader that went away shows here, not in the interpreter's last flush
            sys.stdout.flush()
    except BrokenPipeError:
        if program:  # what is still buffered goes nowhere, without a second error at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 128 + int(signal.SIGPIPE)
    if program:
        # Everything is written. A Ctrl-C from now on would interrupt torch's, logging's or
        # multiprocessing's atexit callbacks ("Exception ignored in atexit callback"):
        # ignore it and let the interpreter finish.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        distributed = sys.modules.get("torchloom.engine.distributed")  # imported if it ran
        if distributed is not None and distributed.joined_a_group():
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)  # see joined_a_group
    return status


def _dispatch(argv: Sequence[str] | None) -> int:
    args = parse(argv)
    # Before any subcommand imports torch, which reads it once (see torchloom/host_memory.py).
    prefer_huge_page_tensors()
    with stopping_on_signals():
        return _run_command(args)


def _run_command(args: argparse.Namespace) -> int:
    from torchloom.errors import LoomError, StorageError  # light: no torch

    try:
        module = importlib.import_module(f"torchloom.cli.{SUBCOMMANDS[args.command][0]}")
        return int(module.run(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        if stop_asked():  # the interrupt, turned into another error by what it cut short
            from torchloom.engine.run_folder import failure_reason

            print(f"interrupted (where it stopped: {failure_reason(error)})", file=sys.stderr)
            return 130
        if isinstance(error, LoomError):
            shown = error
        elif isinstance(error, OSError) and error.errno in STORAGE_ERRNOS:
            shown = StorageError.from_os(error.filename or "?", error)
        else:
            raise
        if args.debug:
            traceback.print_exc()
        print(shown.format(), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
