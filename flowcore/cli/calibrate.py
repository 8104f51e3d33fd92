"""`flowcore calibrate`: a corpus or stored embeddings through a fitted calibrator, resumably (`flowcore.batch`)."""
from __future__ import annotations

import argparse

from flowcore import defaults
from flowcore.cli import arguments


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="calibrate a whole corpus or stored embeddings with a fitted calibrator (streaming, resumable)",
        description="Calibrate a text corpus or stored embeddings with a fitted calibrator (any calibration "
        "`flowcore fit` writes), a chunk at a time. Killed, or stopped by Ctrl-C or SIGTERM (at the next chunk "
        "boundary; exit status 130/143), the same command resumes after the last completed chunk "
        "(OUT.progress.json). Rejected rows, NaN/Inf after calibration included, are listed in OUT.rejects.jsonl and "
        "are NaN rows (.npy) or null vectors (.parquet); OUT.manifest.json describes a finished output; one job at "
        "a time writes it (OUT.lock). Progress: a bar on a terminal; when stderr is a file or a pipe, a plain line "
        f"every {defaults.PROGRESS_INTERVAL_S:g} s (rows, rows/s, time left), and at the start where the job "
        "resumes (--quiet: none). "
        "docs/faults.md lists every fault and what you see.",
    )
    calibrator = parser.add_mutually_exclusive_group(required=True)
    calibrator.add_argument("--calibrator", metavar="FILE",
                            help="a calibrator file written by `flowcore fit` (a flow or any other calibration)")
    arguments.add_renamed(calibrator, "--flow", "--calibrator")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--input",
                        help="text corpus: .txt (one sentence per line), .jsonl, .csv (with header) or .parquet; a "
                        "file, or a folder or quoted glob of such files of one format, read in sorted order as one")
    source.add_argument("--embeddings", help="stored embeddings: a 2-D .npy, or .parquet with a vector column; a "
                        "file, a folder or a quoted glob")
    parser.add_argument("--out", required=True,
                        help="output: .npy (float32, row i = input row i) or .parquet (id, a "
                        "fixed_size_list<float32>[dim] vector column, the kept columns)")
    parser.add_argument("--text-field", default=defaults.TEXT_FIELD, help=arguments.TEXT_FIELD_HELP)
    parser.add_argument("--id-field", default=None,
                        help="JSON key / column holding the row id (default: the row number)")
    parser.add_argument("--vector-field", default=defaults.VECTOR_COLUMN,
                        help="parquet column holding stored embeddings")
    parser.add_argument("--vector-column", default=defaults.VECTOR_COLUMN,
                        help="name of the vector column of .parquet output")
    parser.add_argument("--keep-columns", default=None, type=_column_list, metavar="A,B",
                        help="input columns copied to .parquet output (jsonl/csv/parquet text, parquet embeddings), "
                        "with the type stored in parquet, else as strings (other JSON values as JSON text)")
    parser.add_argument("--normalize", action="store_true",
                        help="scale calibrated vectors to unit length (for cosine / dot-product stores)")
    parser.add_argument("--model", default=None,
                        help="encoder for text input (default: the one the calibrator records)")
    parser.add_argument("--pooling", default=None,
                        help="pooling for text input (default: the one the calibrator records)")
    arguments.add_quantize_argument(parser)
    parser.add_argument("--batch-size", type=int, default=defaults.BATCH_SIZE, help="encoder batch size")
    parser.add_argument("--chunk-rows", type=int, default=None,
                        help=f"rows per chunk (resume granularity; a shard on Ray); default: "
                        f"{defaults.TEXT_CHUNK_ROWS} sentences, or ~{defaults.EMBEDDING_CHUNK_BYTES >> 20} MiB "
                        "of vectors")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (pinned for resuming: float results depend on it); default: the CPUs "
                        "this process may use for text, one fewer for stored vectors, 1 per Ray worker")
    parser.add_argument("--restart", action="store_true", help="ignore an unfinished earlier run and start over")
    arguments.add_device_argument(parser)
    arguments.add_progress_arguments(parser)
    arguments.add_renamed(parser, "--no-progress", "--quiet")
    parser.add_argument("--engine", choices=("local", "ray"), default="local",
                        help="local: this process, one output file; ray: a Ray Data actor pool, writing OUT/ as a "
                        "folder of parquet shards (docs/scaling.md)")
    parser.add_argument("--address", default=None,
                        help="(ray) a running Ray cluster, e.g. auto or ray://head:10001; default: a local one")
    parser.add_argument("--num-workers", type=int, default=None,
                        help="(ray) actors, each with its own model copy; default: one per CPU (or per GPU)")
    parser.add_argument("--gpus-per-worker", type=float, default=0, help="(ray) GPUs per actor; 0: CPU only")
    parser.set_defaults(func=run)


def _column_list(value: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in value.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected column names separated by commas, got {value!r}")
    return names


def job_options(args: argparse.Namespace) -> dict:
    """The job options (`flowcore.batch.core.JobSpec`) of both engines that the parsed `calibrate` flags ask for."""
    return dict(input=args.input, embeddings=args.embeddings, text_field=args.text_field, id_field=args.id_field,
                vector_field=args.vector_field, model=args.model, pooling=args.pooling, quantize=args.quantize,
                batch_size=args.batch_size, chunk_rows=args.chunk_rows, restart=args.restart, threads=args.threads,
                show_progress_bar=arguments.progress_choice(args), keep_columns=args.keep_columns or (),
                vector_column=None if args.vector_column == defaults.VECTOR_COLUMN else args.vector_column,
                normalize=args.normalize, device=args.device)


def run(args: argparse.Namespace) -> int:
    if args.engine == "ray":
        from flowcore.ray import calibrate_ray

        if args.device is not None:
            raise ValueError("--device is for --engine local; on Ray, --gpus-per-worker puts each worker on a GPU")
        arguments.check_output(args.out, inputs=[args.calibrator, args.input, args.embeddings], folder=True)
        print(calibrate_ray(args.calibrator, args.out, address=args.address, num_workers=args.num_workers,
                            gpus_per_worker=args.gpus_per_worker, **job_options(args)))
        return 0
    if args.address is not None or args.num_workers is not None or args.gpus_per_worker:
        raise ValueError("--address, --num-workers and --gpus-per-worker need --engine ray")
    from flowcore.batch.job import calibrate_file

    arguments.check_output(args.out, inputs=[args.calibrator, args.input, args.embeddings],
                           suffixes=(".npy", ".parquet"))
    print(calibrate_file(args.calibrator, args.out, **job_options(args)))
    return 0
