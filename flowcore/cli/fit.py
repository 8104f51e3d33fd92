"""`flowcore fit`: train a flow on embeddings (.npy) or on a text corpus, save it as one file."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from flowcore.cli import CLIError, check_device
from flowcore.flows.glow import CONFIGS


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "fit", help="train a flow on embeddings or a text corpus",
        description="Train a BERT-flow Glow by maximum likelihood and save it (safetensors + JSON).")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--embeddings", type=Path, help="a (rows, dim) .npy array of sentence vectors")
    source.add_argument("--input", type=Path, help="a text corpus (.txt, .jsonl, .csv, .parquet), encoded first")
    parser.add_argument("--out", type=Path, required=True, help="where to write the flow file")
    parser.add_argument("--config", default="l2_d3_w32", choices=sorted(CONFIGS), help="Glow levels/depth/width")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-rows", type=int, help="fit on a reproducible random sample of this many rows")
    parser.add_argument("--model", default="default", help="encoder for --input (Hugging Face name or folder)")
    parser.add_argument("--pooling", default="first-last-avg", help="pooling for --input")
    parser.add_argument("--text-field", default="text", help="text column/field for .jsonl/.csv/.parquet input")
    parser.add_argument("--device", help="torch device, e.g. cuda")
    parser.set_defaults(func=run)


def _sample_rows(rows: int, max_rows: int | None, seed: int) -> np.ndarray | None:
    if max_rows is None or max_rows >= rows:
        return None
    if max_rows < 2:
        raise CLIError(f"--max-rows must be at least 2, got {max_rows}")
    return np.sort(np.random.default_rng(seed).choice(rows, size=max_rows, replace=False))


def _load_embeddings(args) -> np.ndarray:
    try:
        array = np.load(args.embeddings, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise CLIError(f"{args.embeddings}: no such file") from None
    except ValueError as error:
        raise CLIError(f"{args.embeddings}: not a readable .npy array ({error})") from None
    if array.ndim != 2:
        raise CLIError(f"{args.embeddings}: expected a 2-D (rows, dim) array, got shape {array.shape}")
    chosen = _sample_rows(len(array), args.max_rows, args.seed)
    return np.asarray(array if chosen is None else array[chosen])


def _encode_corpus(args) -> tuple[np.ndarray, dict]:
    from flowcore.text.encoder import Encoder
    from flowcore.batch.readers import count_reasons, sample_texts

    rejects = []
    texts = sample_texts(args.input, args.max_rows, args.seed, text_field=args.text_field, rejects=rejects)
    if rejects:
        reasons = ", ".join(f"{count} {reason}" for reason, count in count_reasons(rejects).items())
        print(f"{args.input}: skipped {len(rejects)} unusable row(s) ({reasons}); first at row {rejects[0].row}")
    if len(texts) < 2:
        raise CLIError(f"{args.input}: needs at least 2 usable sentences, found {len(texts)}")
    encoder = Encoder(args.model, pooling=args.pooling, device=args.device)
    vectors = encoder.encode(texts)
    return vectors, {"encoder": encoder.model_id, "pooling": encoder.pooling}


def run(args) -> int:
    from flowcore.calibration.calibrator import FlowCalibrator

    check_device(args.device)
    started = time.perf_counter()
    if args.embeddings is not None:
        data, metadata = _load_embeddings(args), {}
    else:
        data, metadata = _encode_corpus(args)
    calibrator = FlowCalibrator(config=args.config, epochs=args.epochs, batch_size=args.batch_size,
                                lr=args.lr, seed=args.seed, device=args.device)
    calibrator.fit(data)
    calibrator.metadata = metadata
    calibrator.save(args.out)
    print(f"fitted {args.config} on {len(data)} x {data.shape[1]} in {time.perf_counter() - started:.1f}s; "
          f"final loss {calibrator.losses[-1]:.4f} bits/dim; wrote {args.out}")
    return 0
