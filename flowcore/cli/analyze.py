"""`flowcore analyze`: the BERT-flow paper's analyses and "does calibration help here?" (`flowcore.analysis`)."""
from __future__ import annotations

import argparse
import os
import sys

from flowcore import defaults
from flowcore.cli import CLIError, arguments
from flowcore.sts.baselines import CALIBRATIONS
from flowcore.sts.data import DATASETS, fit_corpus_sentences, load_test, read_sentence_file
from flowcore.sts.pairs import load_pairs_files


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "analyze",
        help="isotropy, word-frequency and lexical-overlap analyses, and whether calibration helps your encoder",
        description="Analyse an encoder on a corpus (--input, --embeddings or --sts-dataset): isotropy before and "
        "after each calibration fitted on it without labels (random-pair cosines, IsoScore, effective rank, top "
        "principal-component variance), token-embedding norms and k-NN distances by word frequency, and on "
        "labelled pairs (--sts-dataset's test split, --pairs) each calibration's Spearman, its correlation with "
        "edit distance and a recommendation. Writes analysis.json, summary.md and PNG figures to --out.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", default=None, help="a text file, one sentence per line")
    source.add_argument("--embeddings", default=None,
                        help="stored (n, d) vectors; without --model only their isotropy is analysed, with it the "
                        "vectors must come from that --model and --pooling")
    source.add_argument("--sts-dataset", default=None, choices=DATASETS,
                        help="an STS dataset from --data-dir: its sentences (all splits) are the corpus, its test "
                        "pairs the labelled pairs")
    parser.add_argument("--out", required=True, help="folder for analysis.json, summary.md, *.png")
    parser.add_argument("--model", default=None,
                        help=f"{arguments.MODEL_HELP}; 'default' is used when not given, except with --embeddings")
    parser.add_argument("--pooling", default=None,
                        help=f"cls, mean, last2-avg, first-last-avg, static-avg or layers=I,J; default: "
                        f"{arguments.POOLING_DEFAULT}")
    arguments.add_pairs_arguments(parser, "labelled dev pairs, whose Spearman under each calibration decides the "
                                  "recommendation")
    parser.add_argument("--calibration", default=",".join(defaults.ANALYZE_CALIBRATIONS),
                        type=lambda t: arguments.comma_names(t, CALIBRATIONS, "calibration"),
                        help=f"comma-separated calibrations from {', '.join(CALIBRATIONS)}, each fitted on the corpus")
    parser.add_argument("--frequency", default="wordfreq",
                        type=lambda t: arguments.comma_names(t, ("wordfreq", "corpus", "none"), "frequency"),
                        help="token frequencies for the frequency analyses: wordfreq (English word frequencies), "
                        "corpus (counted on the corpus with the encoder's tokenizer), both, or none")
    parser.add_argument("--edit-unit", default="word", choices=("word", "char"),
                        help="edit distance in words or characters for the lexical-overlap bias")
    parser.add_argument("--random-pairs", type=int, default=defaults.RANDOM_PAIRS,
                        help="random pairs for the cosine statistics")
    arguments.add_calibration_arguments(parser)
    parser.add_argument("--seed", type=int, default=0, help="seed of the random pairs and the flow")
    arguments.add_encoding_arguments(parser)
    arguments.add_renamed(source, "--corpus", "--input")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    arguments.check_positive(("--random-pairs", args.random_pairs), ("--batch-size", args.batch_size))
    settings = arguments.calibration_settings(args)
    frequency = [] if "none" in args.frequency else args.frequency
    if "none" in args.frequency and len(args.frequency) > 1:
        raise CLIError("--frequency none cannot be combined with other sources")
    if "corpus" in frequency and args.input is None and args.sts_dataset is None:
        raise CLIError("--frequency corpus counts tokens in sentences: use --input or --sts-dataset")
    arguments.check_pairs_options(args)
    arguments.check_output(args.out, inputs=[args.input, args.embeddings], folder=True)
    for option, path in (("--input", args.input), ("--embeddings", args.embeddings)):
        if path is not None:
            arguments.check_input(path, option)
    if args.sts_dataset is not None:
        arguments.check_data_dir(args.data_dir, "--sts-dataset")
    from flowcore.analysis.analyze import analyze  # deferred: imports torch, which CLI start-up does without
    from flowcore.analysis.report import write_report
    from flowcore.batch.vector_sources import NpyMatrix

    if args.model is None and args.embeddings is not None:  # no encoder: only the vectors' isotropy
        if args.pairs:
            raise CLIError("--pairs needs an encoder to embed them: add --model (the one that made --embeddings)")
        if args.frequency != ["wordfreq"]:
            raise CLIError("--frequency analyses the encoder's token embeddings: add --model")
        frequency, encoder = [], None
    else:
        encoder = arguments.build_encoder(args, model=args.model or defaults.MODEL)
    vectors = sentences = None
    pairs = load_pairs_files(args.pairs, args.pairs_columns, args.skip_bad) if args.pairs else []
    if args.input is not None:
        sentences, name = read_sentence_file(args.input), os.path.basename(args.input)
    elif args.embeddings is not None:
        matrix = NpyMatrix(args.embeddings)
        matrix.check_embeddings()  # the rule of every command that reads stored vectors
        vectors, name = matrix.read(), os.path.basename(args.embeddings)
        if encoder is not None and vectors.shape[1] != encoder.dim:
            raise CLIError(f"--embeddings {args.embeddings} holds {vectors.shape[1]}-wide vectors but "
                           f"{encoder.model_id} gives {encoder.dim}: use the --model that made them")
    else:
        _, sentences = fit_corpus_sentences(args.data_dir, args.sts_dataset, "target")
        name = f"{args.sts_dataset} (all splits)"
        pairs = [load_test(args.data_dir, args.sts_dataset), *pairs]
    progress = (lambda line: print(line, file=sys.stderr, flush=True)) if arguments.show_progress(args) else None
    result = analyze(vectors, encoder=encoder, sentences=sentences, corpus_name=name, pairs=pairs,
                     calibrations=args.calibration, settings=settings, frequency_sources=frequency,
                     edit_unit=args.edit_unit, random_pairs=args.random_pairs, seed=args.seed,
                     cache=arguments.embedding_cache(args), batch_size=args.batch_size, progress=progress)
    paths = write_report(result, args.out)
    print(paths["summary"].read_text(encoding="utf-8"), end="")
    print(f"wrote {', '.join(str(path) for path in paths.values())}", file=sys.stderr)
    failed = [name for name, entry in result["calibrations"].items() if "error" in entry]
    if failed:
        print(f"flowcore analyze: {', '.join(failed)} failed (see summary.md)", file=sys.stderr)
        return 1
    return 0

