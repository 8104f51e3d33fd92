"""`flowcore sts`: the BERT-flow experiment on the STS benchmarks or your own pairs, as a markdown table."""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time

from flowcore import defaults
from flowcore.calibration.recipes import RECIPES
from flowcore.cli import CLIError, arguments
from flowcore.flows.configs import CONFIGS
from flowcore.runtime import parallel_jobs
from flowcore.sts import report
from flowcore.sts.baselines import CALIBRATIONS, FLOW_INPUTS, prefitted
from flowcore.sts.data import DATASETS
from flowcore.sts.pairs import load_pairs_files
from flowcore.sts.protocol import evaluate


def _flow_input(text: str) -> str:
    """`--flow-input`, with its earlier spelling `whiten` (whiten first) read as `prewhiten`."""
    if text == "whiten":
        print("flowcore sts: --flow-input whiten is now spelled --flow-input prewhiten", file=sys.stderr)
        return "prewhiten"
    return text


@contextlib.contextmanager
def _progress_on_stderr(progress: bool):
    """The `flowcore.sts` and embedding cache loggers' warnings (and INFO lines when `progress`) on stderr, bare."""
    level = logging.INFO if progress else logging.WARNING
    handler = logging.StreamHandler(sys.stderr)  # its default format is the bare message
    handler.setLevel(level)
    with contextlib.ExitStack() as restore:
        for name in ("flowcore.sts", "flowcore.text.cache"):
            logger = logging.getLogger(name)
            restore.callback(setattr, logger, "propagate", logger.propagate)
            restore.callback(logger.setLevel, logger.level)
            restore.callback(logger.removeHandler, handler)
            logger.addHandler(handler)
            logger.setLevel(min(level, logger.getEffectiveLevel()))
            logger.propagate = False  # printed once, even where the caller has configured the root logger
        yield


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "sts",
        help="evaluate an encoder with and without calibration on the STS benchmarks (the BERT-flow experiment)",
        description="Spearman x100 of cosine similarity against gold on the STS12-16, STS-B and SICK-R test "
        "sets (or your own labelled pairs, --pairs), for the raw encoder and after each calibration "
        "fitted without labels (or loaded, --calibrator). Progress and warnings go to stderr, the table to stdout.",
    )
    parser.add_argument("--model", default=defaults.MODEL, help=arguments.MODEL_HELP)
    parser.add_argument("--pooling", default=defaults.STS_POOLINGS,
                        type=lambda t: arguments.comma_names(t, None, "pooling"),
                        help="pooling, or several separated by commas (one table row group each): "
                        "cls, mean, last2-avg, first-last-avg, static-avg, layers=I,J")
    parser.add_argument("--calibration", default=None,
                        type=lambda t: arguments.comma_names(t, CALIBRATIONS, "calibration"),
                        help=f"comma-separated calibrations from {', '.join(CALIBRATIONS)} (as 'flowcore fit "
                        "--calibration'; none: the raw vectors; auto says which it chose); default: "
                        f"{','.join(defaults.STS_CALIBRATIONS)}; with --calibrator only none and the file's "
                        "calibration")
    parser.add_argument("--datasets", default=None, type=lambda t: arguments.comma_names(t, DATASETS, "dataset"),
                        help=f"comma-separated built-in datasets (default: all of {','.join(DATASETS)})")
    arguments.add_pairs_arguments(parser, "evaluate your own labelled pairs instead of the built-in datasets, one "
                                  "table column (dataset) per FILE, named after its stem")
    parser.add_argument("--fit-corpus", default="target",
                        help="what the calibrations are fitted on, without labels: 'target' (all sentences of the "
                        "evaluated dataset, all splits, as in the paper; with --pairs: each file's own), 'train' (its "
                        "train split; not with --pairs), or a text file with one sentence per line. Fewer than 5 x "
                        "dim distinct sentences give a warning")
    parser.add_argument("--calibrator", default=None, metavar="FILE",
                        help="a calibrator file from 'flowcore fit' (a flow or any other calibration, for this encoder "
                        "and pooling): applied as it is, nothing is fitted; --calibration may then hold none and "
                        "the file's calibration only")
    parser.add_argument("--sick-split", default="test", choices=("test", "all"),
                        help="SICK-R pairs scored: 'test' (4927, the paper's protocol) or 'all' (9927, MTEB's)")
    parser.add_argument("--aggregation", default="all", choices=report.AGGREGATIONS,
                        help="STS12-16 figure of the first table: 'all' (subsets concatenated, as SBERT, SimCSE and "
                        "MTEB report), 'wmean' (size-weighted mean over subsets, as BERT-flow and BERT-whitening "
                        "report) or 'mean'; a second table shows the other of all and wmean; each table has the "
                        "published figures of its protocol under it, and the JSON holds all three")
    parser.add_argument("--config", default=defaults.CONFIG, choices=sorted(CONFIGS),
                        help="Glow configuration of the flow (levels, depth, width)")
    parser.add_argument("--recipe", default=defaults.RECIPE, choices=RECIPES,
                        help="the flow's fit recipe (see 'flowcore fit --help'); --epochs, --lr and "
                        "--train-batch-size override its values")
    parser.add_argument("--epochs", type=int, default=None,
                        help=f"flow training epochs (default: the recipe's: {arguments.recipe_values('epochs')})")
    parser.add_argument("--lr", type=float, default=None,
                        help=f"flow learning rate (Adam; default: the recipe's: {arguments.recipe_values('lr')})")
    parser.add_argument("--train-batch-size", type=int, default=None,
                        help="rows per flow training step (default: the recipe's: "
                        f"{arguments.recipe_values('batch_size')})")
    parser.add_argument("--flow-input", default=None, type=_flow_input, choices=FLOW_INPUTS,
                        help="what the flow is fitted on, when not its recipe's choice: coordinates standardized "
                        "over the fit corpus, vectors whitened first (prewhiten), or the raw vectors (diverges on "
                        "poolings with constant coordinates)")
    arguments.add_calibration_arguments(parser)
    parser.add_argument("--seed", type=int, default=0, help="seed of the flow's initialisation and batch order")
    parser.add_argument("--json", default=None, metavar="OUT.json", help="also write the result records here")
    parser.add_argument("--jobs", type=int, default=None,
                        help="datasets whose flows are fitted side by side on CPU (after all are encoded), each in a "
                        "forked one-thread process; the results do not change with it (default: the CPUs this "
                        "process may use)")
    arguments.add_encoding_arguments(parser)
    for old, new in (("--flow", "--calibrator"), ("--flow-config", "--config"), ("--flow-recipe", "--recipe"),
                     ("--flow-epochs", "--epochs"), ("--flow-lr", "--lr"), ("--flow-batch-size", "--train-batch-size")):
        arguments.add_renamed(parser, old, new)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    arguments.check_pairs_options(args)
    if args.pairs is None:
        arguments.check_data_dir(args.data_dir, "evaluating the built-in datasets")
    elif args.datasets is not None:
        raise CLIError("--pairs evaluates your files instead of the built-in datasets: drop --datasets")
    elif args.fit_corpus == "train":
        raise CLIError("--fit-corpus train needs the built-in datasets (your pairs have no train split); "
                       "use 'target' (their own sentences) or a file with one sentence per line")
    if args.fit_corpus not in ("target", "train") and not os.path.isfile(args.fit_corpus):
        raise CLIError(f"--fit-corpus {args.fit_corpus!r} is neither 'target', 'train' nor an existing file")
    if args.calibrator is not None:
        arguments.check_input(args.calibrator, "--calibrator")
        if args.fit_corpus != "target":
            raise CLIError("--fit-corpus does not apply with --calibrator (the calibrator file is already fitted)")
    if args.json is not None:
        arguments.check_output(args.json, inputs=[args.calibrator, *(args.pairs or [])], flag="--json")
    arguments.check_positive(("--epochs", args.epochs), ("--train-batch-size", args.train_batch_size),
                             ("--batch-size", args.batch_size), ("--jobs", args.jobs))
    if args.lr is not None and not args.lr > 0:
        raise CLIError(f"--lr must be positive, got {args.lr}")
    settings = arguments.calibration_settings(args, flow_config=args.config, flow_recipe=args.recipe,
                                              flow_epochs=args.epochs, flow_lr=args.lr,
                                              flow_batch_size=args.train_batch_size, flow_input=args.flow_input)
    cache = arguments.embedding_cache(args)
    started = time.perf_counter()
    records = []
    calibrations = args.calibration or list(defaults.STS_CALIBRATIONS)
    fitted = None
    if args.calibrator is not None:
        given = prefitted(args.calibrator, device=args.device)
        name = given.calibrator.name
        calibrations = args.calibration or ["none", name]
        others = [other for other in calibrations if other not in ("none", name)]
        if others:
            raise CLIError(f"--calibrator applies a {name} calibrator file, nothing is fitted: --calibration may hold "
                           f"none and {name} only, not {', '.join(others)}")
        fitted = {name: given}
    progress = arguments.show_progress(args)
    with _progress_on_stderr(progress):
        pairs = None if args.pairs is None else load_pairs_files(args.pairs, args.pairs_columns, args.skip_bad)
        for pooling in args.pooling:
            encoder = arguments.build_encoder(args, pooling=pooling)
            if fitted is not None:  # refuse a file fitted for another encoder, pooling or width
                given.calibrator.check_encoder(encoder, args.model, what=f"--calibrator {args.calibrator}")
            records += evaluate(encoder, datasets=args.datasets or DATASETS, calibrations=calibrations,
                                data_dir=args.data_dir, fit_corpus=args.fit_corpus, sick_split=args.sick_split,
                                settings=settings, cache=cache, batch_size=args.batch_size, show_progress_bar=progress,
                                pairs=pairs, fitted=fitted, jobs=parallel_jobs(args.jobs))
    if pairs is not None:
        print("Spearman x100 of cosine similarity on your pairs: "
              + ", ".join(f"{p.dataset} ({len(p)} pairs)" for p in pairs) + ".")
    else:
        print(f"Spearman x100 of cosine similarity; {report.AGGREGATION_NOTES[args.aggregation]}; "
              f"SICK-R: {'all 9927 pairs' if args.sick_split == 'all' else '4927-pair test set'}.")
    _print_tables(records, args.aggregation)
    if args.json:
        report.write_json(records, args.json, seconds=round(time.perf_counter() - started, 1))
        print(f"wrote {len(records)} records to {args.json}", file=sys.stderr)
    failed = [r for r in records if r.get("error")]
    if failed:
        print(f"flowcore sts: {len(failed)} evaluation(s) failed (see n/a cells and the messages above)",
              file=sys.stderr)
        return 1
    return 0


def _print_tables(records: list[dict], aggregation: str) -> None:
    """The table under `aggregation`, then (with STS12-16, the only difference) under each other of `REPORTED`,
    each followed by its protocol's published figures, then what auto chose."""
    shown = [aggregation]
    if any(r.get("aggregation") == "all" for r in records):  # a multi-subset dataset: the aggregations differ
        shown += [other for other in report.REPORTED if other != aggregation]
    for index, name in enumerate(shown):
        if index:
            print(f"\n{report.AGGREGATION_NOTES[name]}:")
        print(report.markdown_table(records, name))
        published = report.published_table(records, name)
        if published is not None:
            print(f"\n{published}")
    lines = report.auto_lines(records)
    if lines:
        print("\n" + "\n".join(lines))
