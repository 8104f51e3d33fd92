"""`flowcore export`: a fitted calibrator (a calibrator file, or a whitening fitted here) as a complete
sentence-transformers model folder (`--format st`, flowcore.integrations.sentence_transformers) or as one ONNX
graph from token ids to calibrated vectors (`--format onnx`, flowcore.integrations.onnx)."""
from __future__ import annotations

import argparse
import sys

from flowcore import defaults
from flowcore.calibration.base import create, load
from flowcore.calibration.corpus_size import small_corpus_warning
from flowcore.cli import CLIError, arguments
from flowcore.cli.fit import encode_sample
from flowcore.text.pooling import NAMED_POOLINGS


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a sentence-transformers model folder or an ONNX graph: encoder + pooling + calibration "
        "[+ normalisation]",
        description="Write a complete sentence-transformers model folder (--format st): the encoder's transformer "
        "and tokenizer, the pooling, the calibration and optionally Normalize, with onnx/model.onnx for "
        "backend='onnx'. A linear calibration (a stock Dense layer) with mean or cls pooling loads with "
        "SentenceTransformer(FOLDER) alone; a flow, or another pooling, needs flowcore's "
        "flowcore.integrations.sentence_transformers.load_model(FOLDER), which checks the folder before passing "
        "trust_remote_code=True (passing that flag yourself trusts every file in the folder). Or write one ONNX "
        "graph from token ids to calibrated vectors (--format onnx): FOLDER/model.onnx, the tokenizer files and "
        "flowcore.json, which onnxruntime runs without Python, torch or flowcore (docs/deploy.md).",
    )
    calibration = parser.add_mutually_exclusive_group(required=True)
    calibration.add_argument("--calibrator", metavar="FILE",
                             help="a calibrator file written by `flowcore fit` (a flow or any other calibration; its "
                             "encoder and pooling are the defaults for --model and --pooling; others are refused)")
    calibration.add_argument("--whitening", metavar="CORPUS",
                             help="fit BERT-whitening on this text corpus (.txt, .jsonl, .csv, .parquet) and export "
                             "it as a stock Dense layer")
    parser.add_argument("--out", required=True, help="the model folder to write (new or empty)")
    parser.add_argument("--format", choices=("st", "onnx"), default="st",
                        help="st: a sentence-transformers model folder; onnx: FOLDER/model.onnx, inputs input_ids, "
                        "attention_mask [, token_type_ids] (int64, batch x sequence), output sentence_embedding "
                        "(float32, batch x dim), with the tokenizer files and flowcore.json")
    parser.add_argument("--calibrator-only", action="store_true",
                        help="with --format onnx: FOLDER/calibrator.onnx alone, input embeddings (float32, batch x "
                        "dim) -> calibrated, for vectors that come from elsewhere")
    parser.add_argument("--quantize", choices=("int8",), default=None,
                        help="with --format onnx: int8, the encoder's matrix products dynamically quantised by "
                        "ONNX Runtime (faster on the CPU, a little less accurate: docs/benchmarks.md); the "
                        "calibration stays float32 (so not with --calibrator-only). Not given: float32")
    parser.add_argument("--model", default=None,
                        help="'default', a local model folder or a cached Hugging Face name (default: the "
                        "calibrator's encoder; for --whitening, 'default')")
    parser.add_argument("--pooling", default=None,
                        help=f"one of {', '.join(NAMED_POOLINGS)}, or layers=I,J,... (default: the calibrator's "
                        f"pooling; for --whitening, {arguments.POOLING_DEFAULT})")
    parser.add_argument("--normalize", action="store_true",
                        help="unit-length vectors (st: append Normalize; onnx: L2 normalisation in the graph)")
    parser.add_argument("--max-length", type=int, default=defaults.MAX_LENGTH,
                        help="longer texts are truncated to this many tokens, as by flowcore encode")
    parser.add_argument("--whitening-dim", type=int, default=None, metavar="K",
                        help="with --whitening: keep the K directions of largest variance (BERT-whitening-k)")
    parser.add_argument("--whitening-power", type=float, default=None, metavar="GAMMA",
                        help=f"with --whitening: tempered whitening, x -> (x - mean) U L^-GAMMA (default "
                        f"{defaults.WHITENING_POWER}: full whitening; 0: centre and rotate only)")
    parser.add_argument("--max-rows", type=int, default=None,
                        help="with --whitening: fit on a reproducible random sample of this many rows "
                        "(default: all rows)")
    parser.add_argument("--text-field", default=defaults.TEXT_FIELD,
                        help=f"with --whitening: {arguments.TEXT_FIELD_HELP}")
    parser.add_argument("--seed", type=int, default=0, help="with --whitening: seed of the --max-rows sample")
    arguments.add_device_argument(parser)
    arguments.add_progress_arguments(parser)
    arguments.add_renamed(calibration, "--flow", "--calibrator")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    arguments.check_output(args.out, inputs=[args.calibrator, args.whitening], folder=True)
    whitening_only = (args.whitening_dim, args.whitening_power, args.max_rows)
    if args.calibrator is not None and any(value is not None for value in whitening_only):
        raise CLIError("--whitening-dim, --whitening-power and --max-rows apply to --whitening, not to --calibrator")
    if args.format != "onnx" and (args.calibrator_only or args.quantize is not None):
        raise CLIError("--calibrator-only and --quantize apply to --format onnx, not to --format st")
    if args.format == "onnx":  # a missing extra is named before any work
        from flowcore.integrations.onnx import CALIBRATOR_GRAPH, GRAPH, export, require_onnx

        require_onnx()
    else:
        from flowcore.integrations.sentence_transformers import export, needs_trust_remote_code
    if args.whitening is not None:
        settings = {"keep": args.whitening_dim, "power": args.whitening_power}
        whitening = create("whitening", **{key: value for key, value in settings.items() if value is not None})
        vectors, encoder, distinct = encode_sample(args.whitening, args, sys.stderr, model=args.model or defaults.MODEL,
                                                   pooling=args.pooling, quantize=None)
        warning = small_corpus_warning(distinct, vectors.shape[1], "--whitening CORPUS")
        if warning is not None:
            print(f"flowcore export: warning: {warning}", file=sys.stderr)
        calibrator = whitening.fit(vectors, encoder=encoder)
        what = f"whitening to {calibrator.output_dim} dims fitted on {len(vectors)} sentences of {args.whitening}"
    else:
        calibrator = load(args.calibrator)
        what = f"{calibrator.name} {args.calibrator}"
    if args.format == "onnx":
        if args.calibrator_only and (args.model is not None or args.pooling is not None):
            raise CLIError("--calibrator-only writes the calibration alone: --model and --pooling do not apply")
        out = export(args.out, calibrator, model=args.model, pooling=args.pooling, normalize=args.normalize,
                     max_length=args.max_length, quantize=args.quantize, calibrator_only=args.calibrator_only)
        graph = CALIBRATOR_GRAPH if args.calibrator_only else GRAPH
        print(f"wrote {out}/{graph} ({what}{', int8' if args.quantize else ''}) and {out}/flowcore.json; run it "
              "with onnxruntime (docs/deploy.md)")
        return 0
    out = export(args.out, calibrator, model=args.model, pooling=args.pooling, normalize=args.normalize,
                 max_length=args.max_length)
    how = (f"flowcore.integrations.sentence_transformers.load_model({out!r})  (needs flowcore installed; "
           "SentenceTransformer(..., trust_remote_code=True) would trust every file in the folder)"
           if needs_trust_remote_code(out) else f"SentenceTransformer({out!r})")
    print(f"wrote {out} ({what}); load it with {how}")
    return 0
