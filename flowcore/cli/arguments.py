"""Argument types, checks and the help formatter that several subcommands share."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from flowcore import defaults
from flowcore.sts.pairs import PairColumns

__all__ = ["HelpFormatter", "QUANTIZE_HELP", "add_encoding_arguments", "add_quantize_argument", "check_output",
           "comma_files", "comma_names", "pair_columns", "quantize_options"]


def check_output(out, inputs=(), suffixes: tuple[str, ...] = (), folder: bool = False, flag: str = "--out") -> Path:
    """`out` checked before any work, as a `CLIError` naming it: a file output is no existing
    directory (a `folder` output no existing file), its parent folder exists, it is none of
    `inputs` (the same path, a symlink to it or a hard link), and it ends in one of `suffixes`."""
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
    """Defaults in the help, except the unset ones (None, False), whose help says what happens."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


QUANTIZE_HELP = ("int8: a fast CPU mode, the encoder's MatMuls quantised to int8 and run by ONNX Runtime "
                 "(pip install 'flowcore[onnx]'; building it takes ~15 s per model). Measured on a 2-core AMD EPYC "
                 "(AVX2), all-MiniLM-L6-v2, STS-B test, mean pooling (pytest bench/test_bench_encoder.py): 387 "
                 "sentences/s, 1.5x sentence-transformers' int8 ONNX model (258) and 1.3x float32 (298); STS-B "
                 "Spearman 0.09 points lower (81.95 vs 82.03; sentence-transformers' int8 model: 81.62). Cached "
                 "vectors are kept apart from float32 ones. Not given: float32")


def add_quantize_argument(parser: argparse.ArgumentParser) -> None:
    """--quantize, for every subcommand that builds an Encoder (`flowcore.text.quantize`)."""
    parser.add_argument("--quantize", choices=("int8",), default=None, help=QUANTIZE_HELP)


def quantize_options(args: argparse.Namespace) -> dict:
    """The Encoder keyword for `--quantize`: none when not given, so float32 calls stay as before."""
    return {"quantize": args.quantize} if args.quantize is not None else {}


def add_encoding_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of subcommands that encode sentences through the embedding cache (`sts`,
    `analyze`): --cache-dir, --no-cache, --batch-size, --max-length, --device, --quantize, --quiet."""
    parser.add_argument("--cache-dir", default=None,
                        help="where encoded sentence vectors are cached (shared by 'flowcore sts' and 'flowcore "
                        "analyze'); if not given, $FLOWCORE_CACHE or ~/.cache/flowcore/embeddings")
    parser.add_argument("--no-cache", action="store_true", help="encode everything, keep nothing on disk")
    parser.add_argument("--batch-size", type=int, default=defaults.BATCH_SIZE, help="encoding batch size")
    parser.add_argument("--max-length", type=int, default=defaults.MAX_LENGTH,
                        help="longer texts are truncated to this many tokens")
    parser.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    add_quantize_argument(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
