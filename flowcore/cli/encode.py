"""`flowcore encode`: a text file (one sentence per line) or the text field of a jsonl, csv or parquet
corpus into an (N, D) float32 .npy of pooled sentence vectors from a frozen encoder (see flowcore.text.encoder)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flowcore import defaults
from flowcore._fs import atomic_write, write_error
from flowcore._lines import iter_lines, require_file
from flowcore.cli import arguments
from flowcore.text.pooling import NAMED_POOLINGS


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "encode",
        help="encode sentences (one per line, or a corpus's text field) into pooled sentence vectors (.npy)",
        description="Encode a UTF-8 text file, one sentence per line, or the --text-field of a .jsonl, .csv or "
        ".parquet corpus, with a frozen Hugging Face encoder. Row i of the output is line (row) i; empty lines of a "
        "text file are encoded as empty sentences; lines that are not valid UTF-8 or hold a NUL byte, and rows a "
        "corpus rejects (the rules of flowcore calibrate), are NaN rows (and listed on stderr); a UTF-16 or UTF-32 "
        "file is refused.",
    )
    parser.add_argument("--input", required=True, help="text file, one sentence per line (UTF-8), or a .jsonl, "
                        ".csv or .parquet corpus (its --text-field is encoded)")
    parser.add_argument("--text-field", default=defaults.TEXT_FIELD, help=arguments.TEXT_FIELD_HELP)
    parser.add_argument("--out", required=True, help="output .npy file: float32 (lines, dim)")
    parser.add_argument("--model", default=defaults.MODEL, help=arguments.MODEL_HELP)
    parser.add_argument("--pooling", default=None,
                        help=f"one of {', '.join(NAMED_POOLINGS)}, or layers=I,J,... (hidden states to average); "
                        f"default: {arguments.POOLING_DEFAULT}")
    arguments.add_encoder_arguments(parser)
    parser.add_argument("--normalize", action="store_true",
                        help="scale each vector to unit length (for cosine / dot-product stores); NaN rows stay NaN")
    arguments.add_progress_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    arguments.check_output(args.out, inputs=[args.input], suffixes=(".npy",))
    if Path(args.input).suffix.lower() in CORPUS_FORMATS:
        sentences, unusable = read_corpus(args.input, args.text_field)
    else:
        sentences, unusable = read_sentences(args.input)
    if not sentences:
        raise ValueError(f"{args.input} is empty: there are no sentences to encode")
    encoder = arguments.build_encoder(args)
    embeddings = np.full((len(sentences), encoder.dim), np.nan, dtype=np.float32)
    good = [row for row, text in enumerate(sentences) if text is not None]
    if good:
        embeddings[good] = encoder.encode([sentences[row] for row in good], batch_size=args.batch_size,
                                          normalize=args.normalize, show_progress_bar=arguments.progress_choice(args))
    non_finite = [row + 1 for row in good if not np.isfinite(embeddings[row]).all()]  # as line numbers
    zero = [row + 1 for row in good if args.normalize and not embeddings[row].any()]
    try:
        atomic_write(args.out, lambda stream: np.save(stream, embeddings))
    except OSError as error:
        raise write_error(error, args.out, embeddings.nbytes) from None
    print(f"wrote {len(embeddings)} {'unit-length ' if args.normalize else ''}embeddings "
          f"({embeddings.shape[0]} x {embeddings.shape[1]}, pooling {encoder.pooling}) to {args.out}")
    warnings = [(f"{problem}; their rows are NaN", numbers) for problem, numbers in unusable.items()]
    warnings += [("{count} line(s) of {input} encode to the zero vector, which has no direction: their rows stay "
                  "zero, not unit length (lines {shown})", zero),
                 ("the encoder returned NaN/Inf for {count} line(s) of {input} (lines {shown})", non_finite)]
    for problem, numbers in warnings:
        if numbers:
            shown = ", ".join(map(str, numbers[:10])) + (", ..." if len(numbers) > 10 else "")
            print(f"flowcore encode: warning: {problem.format(count=len(numbers), input=args.input, shown=shown)}",
                  file=sys.stderr)
    return 0


def read_sentences(path: str) -> tuple[list[str | None], dict[str, list[int]]]:
    """The lines of `path` (None where one is unusable, e.g. not valid UTF-8) and their numbers by problem."""
    require_file(path)
    lines = list(iter_lines(path))
    unusable: dict[str, list[int]] = {}
    for line in lines:
        if line.problem is not None:
            problem = ("are not valid UTF-8" if line.text is None else "hold a NUL byte" if line.nul is not None
                       else "hold a carriage return inside the line")
            unusable.setdefault(f"{{count}} line(s) of {{input}} {problem} (lines {{shown}})", []).append(line.number)
    return [None if line.problem else line.text for line in lines], unusable


CORPUS_FORMATS = (".jsonl", ".ndjson", ".csv", ".parquet", ".pq")
"""Inputs read as a corpus (their text field), by the rules of `flowcore calibrate`; any other file is lines."""


def read_corpus(path: str, text_field: str) -> tuple[list[str | None], dict[str, list[int]]]:
    """The row texts of a jsonl, csv or parquet corpus (None where rejected) and the 0-based rejected rows by reason."""
    from flowcore.batch.text_sources import TextCorpus

    texts: list[str | None] = []
    unusable: dict[str, list[int]] = {}
    for entry, _ in TextCorpus(path, text_field=text_field).entries():
        texts.append(entry.text)
        if entry.reject is not None:
            problem = f"{{count}} row(s) of {{input}} were rejected as {entry.reject.reason} (rows {{shown}})"
            unusable.setdefault(problem, []).append(entry.row)
    return texts, unusable
