"""The `flowcore` command line: one module per subcommand, each with `register(subparsers)`."""
from __future__ import annotations

import argparse
import importlib
import sys
from functools import partial

from flowcore.extras import MissingExtraError

SUBCOMMANDS = ("fit", "encode", "calibrate", "sts", "export", "analyze")


class CLIError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def check_device(name: str | None) -> None:
    """A `CLIError` unless `--device` (every subcommand has it) is unset or a torch device that exists here."""
    if name is None:
        return
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        raise CLIError(f"--device {name!r} is not a torch device (e.g. cpu, cuda, cuda:1)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CLIError(f"--device {name}: this torch build or machine has no CUDA GPU; use --device cpu")


def build_parser() -> argparse.ArgumentParser:
    from flowcore import __version__
    from flowcore.cli.arguments import HelpFormatter

    parser = argparse.ArgumentParser(
        prog="flowcore",
        description="Calibrate sentence embeddings with an unsupervised normalizing flow (BERT-flow).",
    )
    parser.add_argument("--version", action="version", version=f"flowcore {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                       parser_class=partial(argparse.ArgumentParser, formatter_class=HelpFormatter))
    for name in SUBCOMMANDS:
        importlib.import_module(f"flowcore.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_device(args.device)
        return int(args.func(args) or 0)
    except (CLIError, MissingExtraError, ValueError, OSError) as error:
        print(f"flowcore {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as error:  # a batch job's JobInterrupted says where it stopped, and by which signal
        print(f"flowcore {args.command}: {str(error) or 'interrupted (SIGINT)'}", file=sys.stderr)
        return getattr(error, "exit_status", 130)
