"""`flowcore fit`: a calibration (`auto` by default) fitted on embeddings or a text corpus, saved as
one file. Text is encoded once into a resumable cache and a flow trains with checkpoints, so a
killed run resumes to the same model (docs/batch.md)."""
from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from flowcore import defaults
from flowcore.calibration.base import NAMES, create, fit_options, setting_names
from flowcore.calibration.corpus_size import MIN_ROWS_PER_DIM, small_corpus_warning
from flowcore.calibration.moments import row_blocks
from flowcore.calibration.recipes import RECIPES
from flowcore.cli import CLIError, arguments
from flowcore.flows.configs import CONFIGS, COUPLINGS, PERMUTATIONS

_SETTING_FLAGS = {"power": "--whitening-power", "keep": "--whitening-dim", "k": "--abtt-k", "config": "--config",
                  "recipe": "--recipe", "epochs": "--epochs", "batch_size": "--train-batch-size", "lr": "--lr",
                  "patience": "--patience", "coupling": "--coupling", "permutation": "--permutation"}
"""{a method's setting (`setting_names`): its flag}; a flag whose setting the chosen method lacks is refused."""
_FIT_FLAGS = {"checkpoint_every": "--checkpoint-every", "threads": "--threads"}
"""{an option of a method's fit (`fit_options`): its flag}, refused likewise."""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "fit", help="fit a calibration (auto: whitening or none, chosen from the corpus) on embeddings or text",
        description="Fit a calibration without labels and save it (safetensors + JSON): auto (the default: "
        "whitening where the corpus's nearest-neighbour graph is dominated by hubs, else the raw vectors; it says "
        "which and why), whitening, zca, center, abtt or none, in one pass, or a BERT-flow Glow (--calibration "
        "flow). Every saved file is used alike: flowcore calibrate, sts and export --calibrator, flowcore.load.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--embeddings", type=Path, help="sentence vectors: a (rows, dim) .npy array, or a parquet file "
                        "with a --vector-field column; or a folder or a quoted glob of such files, of one format")
    source.add_argument("--input", type=Path, help="a text corpus (.txt, .jsonl, .csv, .parquet): a file, a folder or "
                        "a quoted glob of files of one format, encoded first")
    parser.add_argument("--out", type=Path, required=True, help="where to write the calibrator file")
    parser.add_argument("--calibration", default=defaults.CALIBRATION, choices=NAMES, metavar="CALIBRATION",
                        help="auto (whitening of the leading directions or none, chosen by the hubness of the "
                        "vectors' 10-NN graph on a seeded sample; --seed), whitening (BERT-whitening), zca, center "
                        "(mean-centring), abtt (all-but-the-top), none (the raw vectors) or flow (a Glow)")
    method = parser.add_argument_group("whitening and abtt (--calibration whitening, abtt)")
    method.add_argument("--whitening-power", type=float, default=None, metavar="GAMMA",
                        help="whitening's power: x -> (x - mean) U L^-GAMMA; 0.5 (the default) is full whitening, "
                        "0 only centres and rotates, values between shrink the dominant directions less")
    method.add_argument("--whitening-dim", type=int, default=None, metavar="K",
                        help="whitening: keep the K directions of largest variance (default: all)")
    method.add_argument("--abtt-k", type=int, default=None,
                        help="abtt: the top directions removed (default: dim / 100)")
    flow = parser.add_argument_group("the flow (--calibration flow)")
    flow.add_argument("--config", default=None, choices=sorted(CONFIGS),
                      help=f"Glow levels/depth/width (default: {defaults.CONFIG})")
    flow.add_argument("--coupling", default=None, choices=COUPLINGS,
                      help=f"each step's coupling, as in the BERT-flow code (default: {defaults.COUPLING}): 'affine' "
                      "(scale and shift) or 'additive' (shift only)")
    flow.add_argument("--permutation", default=None, choices=PERMUTATIONS,
                      help=f"each step's invertible 1x1, as in the BERT-flow code (default: {defaults.PERMUTATION}): "
                      "'lu' (learned) or 'reverse' (fixed; with --recipe standardized or paper)")
    flow.add_argument("--recipe", default=None, choices=RECIPES,
                      help=f"fit recipe (default: {defaults.RECIPE}): 'whitened' (start at whitening, train on 90 %% "
                      "of the rows, keep the best held-out weights, the start included, and stop after --patience "
                      "evaluations without a better score), 'standardized' (1 epoch), or 'paper' (raw input, lr "
                      "1e-3, batch 32, 1 epoch)")
    flow.add_argument("--epochs", type=int, default=None,
                      help="training epochs, the most with held-out evaluations (default: the recipe's: "
                      f"{arguments.recipe_values('epochs')})")
    flow.add_argument("--patience", type=int, default=None, metavar="N",
                      help="with a held-out share: stop after N evaluations in a row without a better held-out "
                      "score (default: the recipe's; 2 for 'whitened')")
    flow.add_argument("--train-batch-size", type=int, default=None,
                      help=f"rows per training step (default: the recipe's: {arguments.recipe_values('batch_size')})")
    flow.add_argument("--lr", type=float, default=None,
                      help=f"Adam's learning rate (default: the recipe's: {arguments.recipe_values('lr')})")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the --max-rows sample, of auto's sample of rows and of the flow")
    parser.add_argument("--max-rows", type=int,
                        help="fit on a reproducible random sample of this many rows (default: all rows)")
    parser.add_argument("--model", default=defaults.MODEL, help=f"encoder for --input: {arguments.MODEL_HELP}")
    parser.add_argument("--pooling", default=None, help=f"pooling for --input; default: {arguments.POOLING_DEFAULT}")
    parser.add_argument("--max-length", type=int, default=defaults.MAX_LENGTH,
                        help="longer texts of --input are truncated to this many tokens")
    parser.add_argument("--batch-size", type=int, default=defaults.BATCH_SIZE,
                        help="sentences per encoder batch, for --input")
    arguments.add_quantize_argument(parser)
    parser.add_argument("--vector-field", default=defaults.VECTOR_COLUMN,
                        help="parquet column holding stored embeddings")
    parser.add_argument("--text-field", default=defaults.TEXT_FIELD, help=arguments.TEXT_FIELD_HELP)
    arguments.add_device_argument(parser)
    flow.add_argument("--checkpoint-every", type=int, default=None, metavar="STEPS",
                      help=f"write a training checkpoint (OUT.checkpoint) every STEPS steps (default: "
                      f"{defaults.CHECKPOINT_EVERY}); a rerun resumes from it")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="the embedding cache, where --input's vectors are kept and found again (shared with "
                        "'flowcore sts' and 'flowcore analyze'); if not given, $FLOWCORE_CACHE or "
                        "~/.cache/flowcore/embeddings")
    parser.add_argument("--no-cache", action="store_true",
                        help="encode --input in a temporary folder, removed after the fit")
    parser.add_argument("--cache", type=Path, default=None, metavar="FILE",
                        help="a .npy file for --input's vectors instead of the embedding cache (memory-mapped; kept)")
    parser.add_argument("--restart", action="store_true",
                        help="ignore an earlier run's checkpoint, encode --input again, and start over")
    flow.add_argument("--threads", type=int, default=None,
                      help="torch CPU threads for training (default: 1 for batches under 256 rows, else all CPUs "
                      "available)")
    arguments.add_progress_arguments(parser)
    parser.set_defaults(func=run)


def _load_embeddings(args, scratch: Path) -> tuple[np.ndarray, np.ndarray | None]:
    """The --embeddings matrix (memory-mapped) and the rows to fit on (None: all; sorted: a --max-rows sample).
    A .npy file is read where it is; parquet, a folder or a glob is gathered into `scratch` first."""
    from flowcore.batch.sampling import sample_row_numbers
    from flowcore.batch.vector_sources import NpyMatrix

    if args.embeddings.suffix.lower() == ".npy" and not any(sign in str(args.embeddings) for sign in "*?["):
        arguments.check_input(args.embeddings, "--embeddings")
        matrix = NpyMatrix(args.embeddings)
        matrix.check_embeddings()  # the rule `flowcore calibrate --embeddings` reads by
        data, rows = matrix.read(), matrix.rows
    else:
        data = _gathered(args, scratch)
        rows = len(data)
    if args.max_rows is None or args.max_rows >= rows:
        return data, None
    if args.max_rows < 2:
        raise CLIError(f"--max-rows must be at least 2, got {args.max_rows}")
    return data, sample_row_numbers(rows, args.max_rows, args.seed)


def _gathered(args, scratch: Path) -> np.ndarray:
    """The stored vectors of --embeddings' parquet file or shards as one memory-mapped matrix."""
    from flowcore.batch.input_files import InputFiles
    from flowcore.batch.job import encode_corpus
    from flowcore.batch.vector_sources import EMBEDDING_FORMATS, EmbeddingFile

    source = InputFiles.open(args.embeddings, lambda path: EmbeddingFile(path, vector_field=args.vector_field),
                             EMBEDDING_FORMATS)
    corpus = encode_corpus(source, scratch / "embeddings.npy", show_progress_bar=arguments.progress_choice(args))
    if corpus.summary.rejected:
        with open(corpus.summary.rejects_path, encoding="utf-8") as lines:
            first = json.loads(lines.readline())
        where = f"{first['file']}, row {first['row']}" if "file" in first else f"row {first['row']}"
        raise CLIError(f"{args.embeddings}: {corpus.summary.rejected} row(s) are not usable vectors "
                       f"({_reasons(corpus.summary.rejects)}; the first: {where}); fit on finite vectors, e.g. "
                       "flowcore calibrate's output without its rejected rows")
    return corpus.vectors


def encode_sample(path, args, skipped_to=None, **encoder_options):
    """The vectors of a `--max-rows` sample of the corpus at `path` (skipped rows reported on `skipped_to`), the
    `build_encoder(args, **encoder_options)` that made them, and their number of distinct sentences."""
    from flowcore.batch.rows import count_reasons
    from flowcore.batch.sampling import sample_stream
    from flowcore.batch.text_sources import read_texts

    rejects = []
    texts = sample_stream((text for corpus in text_input(path, args.text_field).sources
                           for _, _, text in read_texts(corpus.path, args.text_field, rejects=rejects)),
                          args.max_rows, args.seed)
    if rejects:
        print(f"{path}: skipped {len(rejects)} unusable row(s) ({_reasons(count_reasons(rejects))}); first at row "
              f"{rejects[0].row}", file=skipped_to)
    if len(texts) < 2:
        raise CLIError(f"{path}: needs at least 2 usable sentences, found {len(texts)}")
    encoder = arguments.build_encoder(args, **encoder_options)
    vectors = encoder.encode(texts, batch_size=getattr(args, "batch_size", defaults.BATCH_SIZE),
                             show_progress_bar=arguments.progress_choice(args))
    return vectors, encoder, len(set(texts))


def text_input(path, text_field: str):
    """The corpus at `path` (a file, a folder or a glob, of one format) as one source, each file's `text_field`."""
    from flowcore.batch.input_files import InputFiles
    from flowcore.batch.text_sources import TEXT_FORMATS, TextCorpus

    return InputFiles.open(path, lambda file: TextCorpus(file, text_field=text_field), TEXT_FORMATS)


def _cached_corpus(args, scratch: Path):
    """The whole corpus's vectors, encoded once by a resumable job into the embedding cache (--cache FILE; with
    --no-cache, `scratch`) and memory-mapped, its good rows (None: all) and the `Encoder`."""
    from flowcore.batch.job import encode_corpus
    from flowcore.runtime import job_threads

    source = text_input(args.input, args.text_field)
    encoder = arguments.build_encoder(args, threads=job_threads(text=True))
    cache = args.cache or (scratch / "corpus.npy" if args.no_cache else
                           arguments.embedding_cache(args).corpus_file(encoder, args.input, args.text_field))
    corpus = encode_corpus(source, cache, encoder, batch_size=args.batch_size, restart=args.restart,
                           show_progress_bar=arguments.progress_choice(args))
    if corpus.summary.complete and not args.no_cache:
        print(f"{args.input}: its vectors are already in {cache} (--restart encodes it again)")
    if corpus.summary.rejected:
        print(f"{args.input}: skipped {corpus.summary.rejected} unusable row(s) ({_reasons(corpus.summary.rejects)}); "
              f"listed in {corpus.summary.rejects_path}")
    usable = len(corpus.vectors) if corpus.good is None else len(corpus.good)
    if usable < 2:
        raise CLIError(f"{args.input}: needs at least 2 usable sentences, found {usable}")
    return corpus.vectors, corpus.good, encoder


def _reasons(counts: dict[str, int]) -> str:
    """Rejected rows counted by reason, as "3 empty text, 1 broken JSON"."""
    return ", ".join(f"{count} {reason}" for reason, count in counts.items())


def _distinct_rows(data: np.ndarray, rows: np.ndarray | None) -> int:
    """Distinct rows of `data` (of its `rows`, if given), up to what the small-corpus warning needs."""
    seen: set[bytes] = set()
    for block in row_blocks(data, rows):
        seen.update(hashlib.blake2b(row.tobytes(), digest_size=16).digest() for row in np.ascontiguousarray(block))
        if len(seen) >= MIN_ROWS_PER_DIM * data.shape[1]:
            break
    return len(seen)


def _given(args, flags: dict, accepted: tuple) -> dict:
    """{name: value} of the `flags` given on the command line; a one-line error for one the method does not take."""
    given = {}
    for name, flag in flags.items():
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            if name not in accepted:
                raise CLIError(f"{flag} does not apply to --calibration {args.calibration}")
            given[name] = value
    return given


def _method_settings(args) -> dict:
    """The settings of `--calibration` from its flags (--seed and --device where the method takes them)."""
    accepted = setting_names(args.calibration)
    implied = {name: value for name, value in (("seed", args.seed), ("device", args.device)) if name in accepted}
    return {**implied, **_given(args, _SETTING_FLAGS, accepted)}


def _fit_options(args) -> dict:
    """The options of the method's fit: its flags, and for one that trains a progress bar and OUT.checkpoint."""
    accepted = fit_options(args.calibration)
    options = _given(args, _FIT_FLAGS, accepted)
    if "show_progress_bar" in accepted:
        options["show_progress_bar"] = arguments.progress_choice(args)
    if "checkpoint" in accepted:
        options["checkpoint"] = args.out.with_name(args.out.name + ".checkpoint")
        if args.restart:
            options["checkpoint"].unlink(missing_ok=True)
    return options


def run(args) -> int:
    arguments.check_output(args.out, inputs=[args.embeddings, args.input])
    if args.cache is not None:
        if args.no_cache or args.cache_dir is not None:
            raise CLIError("--cache FILE is instead of the embedding cache: give it without --cache-dir and --no-cache")
        arguments.check_output(args.cache, inputs=[args.embeddings, args.input, args.out], suffixes=(".npy",),
                               flag="--cache")
    with tempfile.TemporaryDirectory(prefix="flowcore-fit-") as scratch:  # --no-cache's encoded corpus
        return _fit(args, Path(scratch))


def _fit(args, scratch: Path) -> int:
    started = time.perf_counter()
    arguments.check_positive(("--checkpoint-every", args.checkpoint_every), ("--patience", args.patience))
    calibrator = create(args.calibration, **_method_settings(args))  # bad settings fail before any work
    options = _fit_options(args)
    rows = distinct = None  # rows: the rows of data to fit on, all unless the cache holds rejected rows
    if args.embeddings is not None:
        (data, rows), encoder = _load_embeddings(args, scratch), None
    elif args.max_rows is not None:
        data, encoder, distinct = encode_sample(args.input, args)
    else:
        data, rows, encoder = _cached_corpus(args, scratch)
    if distinct is None:  # counted on the rows themselves, the sentences being unknown or on disk
        distinct = _distinct_rows(data, rows)
    fitted_rows = len(data) if rows is None else len(rows)
    option = ("a larger --max-rows" if args.max_rows is not None else
              "--embeddings of more sentences" if args.embeddings is not None else "--input FILE")
    warning = small_corpus_warning(distinct, data.shape[1], option,
                                   unit="vectors" if args.embeddings is not None else "sentences")
    if warning is not None:
        print(f"flowcore fit: warning: {warning}", file=sys.stderr)
    calibrator.fit_rows(data, rows, encoder=encoder, **options)  # records the encoder (None: raw embeddings)
    calibrator.save(args.out)
    if "checkpoint" in options:
        options["checkpoint"].unlink(missing_ok=True)
    print(f"{calibrator.report()['summary']}; fitted on {fitted_rows} x {data.shape[1]} in "
          f"{time.perf_counter() - started:.1f}s; wrote {args.out}")
    return 0
