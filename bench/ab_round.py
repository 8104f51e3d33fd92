"""One round of an A/B comparison between two checkouts of flowcore: run it with each checkout's own
Python, alternating, so that both sides see the same machine load. Prints one JSON line of seconds.

Workloads (the goals of bench/ that a change of the library's Python code can move): the
paper-setting fit (d = 384, batch 32, Adam, one epoch over 8,000 rows, 2 threads), the same fit on
4,000 rows with one busy core, inference of 65,536 rows of d = 768 (min of 3), a training step at
batch 8,192 and d = 768 (min of 3, after one), `calibrate_file` on 24,000 stored vectors of d = 384
into .npy (min of 3) and on 384 sentences with the default encoder (min of 2, loading included).

    for round in 1 2 3 4; do
        for tree in ../after ../before; do (cd $tree && .venv/bin/python ../after/bench/ab_round.py); done
    done

`--only inference,npy --repeats 7 --npy-rows 96000` times just those workloads, more often (min and
median). Only arguments that every flowcore 0.x takes are used (`progress` became `show_progress_bar`).
"""
import argparse
import inspect
import json
import os
import statistics
import tempfile
import time

import numpy as np
import torch
from support import busy_core

torch.optim.Adam([torch.zeros(1, requires_grad=True)], fused=True)  # torch's one-time import, outside timings

import flowcore  # noqa: E402
from flowcore.batch.job import calibrate_file  # noqa: E402


def quiet(function) -> dict:
    """The keyword that turns `function`'s progress bar off, in this checkout's spelling."""
    names = inspect.signature(function).parameters
    return {"show_progress_bar": False} if "show_progress_bar" in names else {"progress": False}


def corpus(rows: int, dim: int) -> np.ndarray:
    rng = np.random.default_rng(dim)
    mixing = rng.normal(size=(dim, dim)) / dim**0.5 * np.linspace(0.2, 2.0, dim)
    return (rng.normal(size=(rows, dim)) @ mixing + 0.5).astype(np.float32)


def fitted(data: np.ndarray, path: str, encoder=None) -> None:
    calibrator = flowcore.FlowCalibrator(batch_size=256, seed=0)
    calibrator.fit(data, encoder=encoder, **quiet(calibrator.fit))
    calibrator.save(path)


def timed(runs: int, work) -> list[float]:
    times = []
    for run in range(runs):
        began = time.perf_counter()
        work(run)
        times.append(time.perf_counter() - began)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="fit,busy,inference,train,npy,text", help="workloads, comma-separated")
    parser.add_argument("--repeats", type=int,
                        help="runs per workload (default: 1 fit, 1 busy, 3 inference, 3 train, 3 npy, 2 text)")
    parser.add_argument("--npy-rows", type=int, default=24000, help="rows of the .npy job")
    args = parser.parse_args()
    only = set(args.only.split(","))
    torch.set_num_threads(2)
    seconds = {"tree": os.path.dirname(os.path.dirname(os.path.abspath(flowcore.__file__)))}

    def record(name: str, default_runs: int, work) -> None:
        times = timed(args.repeats or default_runs, work)
        seconds[f"{name} min"] = min(times)
        if len(times) > 1:
            seconds[f"{name} median"] = statistics.median(times)

    if "fit" in only:
        torch.manual_seed(0)
        glow = flowcore.Glow.from_config("l2_d3_w32", 384)
        X = torch.from_numpy(corpus(8000, 384))
        record("fit d384 8000 rows", 1, lambda _: flowcore.fit(glow, X, batch_size=32, lr=1e-3, seed=0,
                                                               **quiet(flowcore.fit)))
    if "busy" in only:
        torch.manual_seed(0)
        glow = flowcore.Glow.from_config("l2_d3_w32", 384)
        X = torch.from_numpy(corpus(4000, 384))
        with busy_core():
            record("fit d384 4000 rows one busy core", 1, lambda _: flowcore.fit(
                glow, X, batch_size=32, lr=1e-3, seed=0, **quiet(flowcore.fit)))
    if "inference" in only:
        flow = flowcore.Glow.from_config("l2_d3_w32", 768).eval()
        Y = torch.from_numpy(corpus(65536, 768))
        with torch.no_grad():
            flow(Y[:256])
            record("inference 65536x768", 3, lambda _: flow(Y))
    if "train" in only:
        torch.manual_seed(0)
        glow = flowcore.Glow.from_config("l2_d3_w32", 768)
        Y = torch.from_numpy(corpus(8192, 768))
        optimizer = torch.optim.Adam(glow.parameters(), lr=1e-5, fused=True)

        def train_step(_) -> None:
            optimizer.zero_grad(set_to_none=True)
            glow.bits_per_dim(Y).backward()
            optimizer.step()

        train_step(0)  # ActNorm's initialisation and a first step, untimed
        record("train step 8192x768", 3, train_step)
    options = quiet(calibrate_file)
    with tempfile.TemporaryDirectory() as folder:
        if "npy" in only:
            vectors = corpus(args.npy_rows, 384)
            np.save(f"{folder}/in.npy", vectors)
            fitted(vectors[:512], f"{folder}/vectors.flow")
            record(f"calibrate npy d384 {args.npy_rows} rows", 3, lambda run: calibrate_file(
                f"{folder}/vectors.flow", f"{folder}/out{run}.npy", embeddings=f"{folder}/in.npy", **options))
        if "text" in only:
            words = "the a one two people man woman dog cat car house city road is are walks runs big small".split()
            rng = np.random.default_rng(0)
            sentences = [" ".join(rng.choice(words, size=rng.integers(5, 25))) for _ in range(384)]
            with open(f"{folder}/corpus.txt", "w", encoding="utf-8") as handle:
                handle.write("\n".join(sentences) + "\n")
            encoder = flowcore.Encoder()
            fitted(encoder.encode(sentences), f"{folder}/text.flow", encoder)
            record("calibrate text 384 sentences", 2, lambda run: calibrate_file(
                f"{folder}/text.flow", f"{folder}/text{run}.npy", input=f"{folder}/corpus.txt", **options))
    print(json.dumps({key: round(value, 3) if isinstance(value, float) else value for key, value in seconds.items()}),
          flush=True)


if __name__ == "__main__":
    main()
