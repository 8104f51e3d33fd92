"""The argument types, checks, flag groups and help formatter every subcommand shares, so that one
concept has one flag everywhere; earlier spellings stay accepted as hidden, announced aliases."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from flowcore import defaults
from flowcore.sts.pairs import PairColumns

__all__ = ["HelpFormatter", "QUANTIZE_HELP", "add_device_argument", "add_encoding_arguments", "add_progress_arguments",
           "add_quantize_argument",
           "add_renamed", "check_output", "comma_files", "comma_names", "pair_columns", "quantize_options",
           "show_progress"]


def check_output(out, inputs=(), suffixes: tuple[str, ...] = (), folder: bool = False, flag: str = "--out") -> Path:
    """`out` checked before any work (kind, parent folder, none of `inputs`, one of `suffixes`), as a
    `CLIError` naming it."""
    from flowcore.cli import CLIError

    path = Path(out)
    if folder and path.exists() and not path.is_dir():
        raise CLIError(f"{flag} {out} is an existing file; give a folder to write into")
    if not folder and path.is_dir():
        raise CLIError(f"{flag} {out} is a directory; give the path of the file to write")
    if not path.absolute().parent.is_dir():
        raise CLIError(f"{flag} {out}: the folder {path.absolute().parent} does not exist")
    if suffixes and path.suffix.lower() not in suffixes:
        raise CLIError(f"{flag} {out} must end in {' or '.join(suffixes)}")
    for source in inputs:
        if source is not None and _same_file(path, Path(source)):
            raise CLIError(f"{flag} {out} is the input {source} itself; writing it would destroy the input")
    return path


def check_input(path, flag: str) -> None:
    """A `CLIError` naming `flag` unless `path` is a regular file: missing, a folder, a pipe or a
    device, each named as what it is (`flowcore._lines.require_file`)."""
    from flowcore._lines import require_file
    from flowcore.cli import CLIError

    if not os.path.lexists(path):
        raise CLIError(f"{flag} {path}: no such file")
    try:
        require_file(path)
    except (OSError, ValueError) as error:
        raise CLIError(f"{flag} {error}") from None


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: the same path, a symlink to it, or a hard link."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return a.absolute() == b.absolute()


def comma_names(text: str, allowed: tuple[str, ...] | None, what: str) -> list[str]:
    """Comma-separated names, each checked against `allowed` (None: any), duplicates dropped."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"no {what} given")
    if allowed is not None:
        unknown = [n for n in names if n not in allowed]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(unknown)}; choose from {', '.join(allowed)}")
    return list(dict.fromkeys(names))


def comma_files(text: str) -> list[str]:
    """Comma-separated pairs files."""
    files = [part.strip() for part in text.split(",") if part.strip()]
    if not files:
        raise argparse.ArgumentTypeError("no pairs file given")
    return files


def pair_columns(text: str) -> PairColumns:
    """`--pairs-columns S1,S2,SCORE` (names or positions)."""
    try:
        return PairColumns.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """A flag's default said once: "(default: X)" unless unset (None, False) or already in the help."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class _Renamed(argparse.Action):
    """An earlier spelling of a flag: hidden from --help, stored as the new flag, announced on stderr."""

    def __init__(self, option_strings, dest, new: str = "", **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: {option_string} is now {self.new}; the old spelling goes at 1.0", file=sys.stderr)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def add_renamed(parser, old: str, new: str, **kwargs) -> None:
    """Accept `old` as a hidden alias of the flag `new` (same destination and value handling: pass
    `type`/`choices`, or `nargs=0, const=True` for a switch)."""
    dest = next(action.dest for action in parser._actions if new in action.option_strings)
    parser.add_argument(old, dest=dest, action=_Renamed, new=new, default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                        **kwargs)


def add_progress_arguments(parser) -> None:
    """--quiet and --progress: progress on stderr only when it is a terminal, unless forced either way."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quiet", action="store_true", help="no progress bars or progress lines on stderr")
    group.add_argument("--progress", action="store_true",
                       help="progress on stderr even when it is not a terminal (by default: only on a terminal)")


def show_progress(args: argparse.Namespace) -> bool:
    """Whether this run shows progress (`add_progress_arguments`)."""
    return not args.quiet and (args.progress or sys.stderr.isatty())


QUANTIZE_HELP = ("int8: a fast CPU mode, the encoder's matrix products quantised to int8 and run by ONNX Runtime "
                 "(pip install 'flowcore[onnx]'; the model is converted once, in seconds), a little less accurate "
                 "than float32 (docs/benchmarks.md); its vectors are cached apart from float32 ones. Not given: "
                 "float32")


def add_quantize_argument(parser: argparse.ArgumentParser) -> None:
    """--quantize, for every subcommand that builds an Encoder (`flowcore.text.quantize`)."""
    parser.add_argument("--quantize", choices=("int8",), default=None, help=QUANTIZE_HELP)


def quantize_options(args: argparse.Namespace) -> dict:
    """The Encoder keyword for `--quantize`: none when not given, so float32 calls stay as before."""
    return {"quantize": args.quantize} if args.quantize is not None else {}


def add_encoding_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of subcommands that encode sentences through the embedding cache (`sts`, `analyze`)."""
    parser.add_argument("--cache-dir", default=None,
                        help="where encoded sentence vectors are cached (shared by 'flowcore sts' and 'flowcore "
                        "analyze'); if not given, $FLOWCORE_CACHE or ~/.cache/flowcore/embeddings")
    parser.add_argument("--no-cache", action="store_true", help="encode everything, keep nothing on disk")
    parser.add_argument("--batch-size", type=int, default=defaults.BATCH_SIZE, help="encoding batch size")
    parser.add_argument("--max-length", type=int, default=defaults.MAX_LENGTH,
                        help="longer texts are truncated to this many tokens")
    add_device_argument(parser)
    add_quantize_argument(parser)
    add_progress_arguments(parser)


def add_device_argument(parser) -> None:
    """--device, for every subcommand that computes."""
    parser.add_argument("--device", default=None, help="torch device, e.g. cpu, cuda, cuda:1 (default: cuda when "
                        "available, else cpu)")
