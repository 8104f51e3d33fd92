"""The Ray engine's overhead: `calibrate_ray` (what `flowcore calibrate --engine ray` runs) against
the single-process job (`calibrate_file`) on the same input, flow, chunking and thread count, on
a local Ray cluster of 2 CPUs. Goal: the Ray engine reaches >= 80 % of the single-process job's
rows/s.

Both sides are timed end to end inside one process that already runs Ray (a job connects to a
running cluster; starting one is a fixed cost per cluster, not per job): loading the flow and
the encoder, reading, encoding, calibrating and writing. Ray's time includes starting its actors
(one model copy each), planning shards and joining the rejects. Ray runs on 2 workers (the
cluster); $FLOWCORE_BENCH_RAY_WORKERS=1,2 adds 1 worker (the single job's CPU count: pure
overhead; 30 s more of the suite per job).

Sizes: $FLOWCORE_BENCH_SENTENCES (default 5000) sentences of the default encoder, and
$FLOWCORE_BENCH_ROWS (default 300,000) x 384 stored vectors: each job runs 20-40 s, long
enough for Ray's fixed costs (actors, planning) to be a fair share of a real job, and the
file takes about 2 minutes (6 at 8000 sentences and 1 M rows). Measured shares of the 2-worker
runs: 85 % and 89 % at 8000 and 1 M, 94 % and 102 % at 4000 and 400 000, 70 % (text) and 84 %
at 3000 and 300 000: below 4000 sentences the actors' start dominates the text job.

Run: `pytest bench/test_bench_ray.py -s`.
"""
import os
import time

import numpy as np
import pytest

from flowcore import Encoder, FlowCalibrator
from flowcore.batch.job import calibrate_file
from flowcore.ray import calibrate_ray

SENTENCES = int(os.environ.get("FLOWCORE_BENCH_SENTENCES", 5000))
ROWS = int(os.environ.get("FLOWCORE_BENCH_ROWS", 300_000))
WORKERS = tuple(sorted({int(count) for count in os.environ.get("FLOWCORE_BENCH_RAY_WORKERS", "2").split(",")} | {2}))
WORDS = ("the a one two people man woman child dog cat car house city road river tree sun rain day night "
         "is are was walks runs sits plays eats reads writes looks big small old new red green quickly slowly "
         "near over under in on at with from into by after before and but or because while").split()


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


def _rates(run_single, run_ray, rows: int) -> dict:
    started = time.perf_counter()
    run_single()
    single = rows / (time.perf_counter() - started)
    rates = {"single": single}
    for workers in WORKERS:
        started = time.perf_counter()
        run_ray(workers)
        rates[f"ray_{workers}"] = rows / (time.perf_counter() - started)
    return rates


def _report(record, goal, group: str, what: str, rows: int, rates: dict) -> None:
    """Times in the summary's table, the 2-worker share against its goal."""
    for key, rate in rates.items():
        label = "single process" if key == "single" else f"Ray {key[4:]} worker{'s' * (key != 'ray_1')}"
        record(group, label, median=rows / rate, **{f"{label} rows/s": round(rate)})
    one = f"; 1 worker {rates['ray_1'] / rates['single']:.0%}" if "ray_1" in rates else ""
    goal(f"Ray engine, {what}: 2 workers' rows/s / single process", rates["ray_2"] / rates["single"], 0.8,
         how=f"{rates['ray_2']:,.0f} / {rates['single']:,.0f} rows/s{one}")


def test_text_engine_overhead(ray_session, tmp_path, record, goal):
    rng = np.random.default_rng(0)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(" ".join(rng.choice(WORDS, size=rng.integers(6, 20))) + "\n" for _ in range(SENTENCES)))
    encoder = Encoder(pooling="first-last-avg", threads=1)
    calibrator = FlowCalibrator(epochs=1, batch_size=256, seed=0)
    calibrator.fit(encoder.encode(corpus.read_text().splitlines()[:1024]), show_progress_bar=False, encoder=encoder)
    calibrator.save(tmp_path / "text.flow")
    options = dict(input=corpus, threads=1, show_progress_bar=False)
    rates = _rates(lambda: calibrate_file(tmp_path / "text.flow", tmp_path / "single.parquet", **options),
                   lambda workers: calibrate_ray(tmp_path / "text.flow", tmp_path / f"ray{workers}",
                                                 num_workers=workers, **options), SENTENCES)
    _report(record, goal, f"ray-text-{SENTENCES}", f"text ({SENTENCES:,} sentences, default encoder)", SENTENCES,
            rates)


def test_embeddings_engine_overhead(ray_session, tmp_path, record, goal):
    rng = np.random.default_rng(1)
    matrix = np.lib.format.open_memmap(tmp_path / "emb.npy", mode="w+", dtype=np.float32, shape=(ROWS, 384))
    for start in range(0, ROWS, 262144):
        matrix[start:start + 262144] = rng.standard_normal((min(ROWS, start + 262144) - start, 384), dtype=np.float32)
    matrix.flush()
    FlowCalibrator(epochs=1, batch_size=256, seed=0).fit(np.array(matrix[:4096]), show_progress_bar=False).save(
        tmp_path / "emb.flow")
    del matrix
    options = dict(embeddings=tmp_path / "emb.npy", threads=1, show_progress_bar=False)
    rates = _rates(lambda: calibrate_file(tmp_path / "emb.flow", tmp_path / "single.parquet", **options),
                   lambda workers: calibrate_ray(tmp_path / "emb.flow", tmp_path / f"ray{workers}",
                                                 num_workers=workers, **options), ROWS)
    _report(record, goal, f"ray-npy-{ROWS}", f"stored vectors ({ROWS:,} x 384)", ROWS, rates)
