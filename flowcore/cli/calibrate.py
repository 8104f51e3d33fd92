"""`flowcore calibrate`: stream a text corpus or stored embeddings through a fitted flow into one
.npy or .parquet file, resumably (see flowcore.batch.job)."""
from __future__ import annotations

import argparse


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="calibrate a whole corpus or stored embeddings with a fitted flow (streaming, resumable)",
        description="Calibrate a text corpus or stored embeddings with a fitted flow, a chunk at a time. "
        "Killed, the same command resumes after the last completed chunk (the progress manifest "
        "OUT.manifest.json); rejected rows are listed in OUT.rejects.jsonl and are NaN rows in .npy output.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--flow", required=True, help="flow file written by `flowcore fit`")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--input",
                        help="text corpus: .txt (one sentence per line), .jsonl, .csv (with header) or .parquet")
    source.add_argument("--embeddings", help="stored embeddings: a 2-D .npy, or .parquet with a vector column")
    parser.add_argument("--out", required=True,
                        help="output: .npy (float32, row i = input row i) or .parquet (id + embedding)")
    parser.add_argument("--text-field", default="text", help="JSON key / column holding the sentence")
    parser.add_argument("--id-field", default=None,
                        help="JSON key / column holding the row id (default: the row number)")
    parser.add_argument("--vector-field", default="embedding", help="parquet column holding stored embeddings")
    parser.add_argument("--model", default=None, help="encoder for text input (default: the one the flow records)")
    parser.add_argument("--pooling", default=None, help="pooling for text input (default: the one the flow records)")
    parser.add_argument("--batch-size", type=int, default=64, help="encoder batch size")
    parser.add_argument("--chunk-rows", type=int, default=None,
                        help="rows per chunk (resume granularity); default: 1024 sentences, or ~8 MiB of vectors")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (pinned for resuming: float results depend on it); default: one "
                        "fewer than the CPUs for embeddings (a core for reading and writing), "
                        "1 for text (bit-reproducible resumes)")
    parser.add_argument("--restart", action="store_true", help="ignore an unfinished earlier run and start over")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def job_options(args: argparse.Namespace) -> dict:
    """The `flowcore.batch.job.calibrate_file` keyword arguments (after the flow path and the
    output) that the parsed `calibrate` flags ask for."""
    return dict(input=args.input, embeddings=args.embeddings, text_field=args.text_field, id_field=args.id_field,
                vector_field=args.vector_field, model=args.model, pooling=args.pooling, batch_size=args.batch_size,
                chunk_rows=args.chunk_rows, restart=args.restart, progress=not args.no_progress, threads=args.threads)


def run(args: argparse.Namespace) -> int:
    from flowcore.batch.job import calibrate_file

    print(calibrate_file(args.flow, args.out, **job_options(args)))
    return 0
