"""Streaming calibration suite.

- npy -> npy at d = 384 and 768: `flowcore calibrate`'s job (memory-mapped reads, chunked
  fsynced writes, progress-file commits) against in-memory `FlowCalibrator.transform` on the same
  flow and rows. Goal: >= 80 % of the in-memory speed (time ratio <= 1.25). The job computes
  on one thread fewer than torch's default (a core for reading and writing), so the in-memory
  transform is also timed with that thread count.
- Text: a txt corpus through the job at its default thread count (every CPU the process may use:
  `job_threads(text=True)`; reading, encoding, flow, writing) against the encoder's own `encode`
  on the same sentences with the same thread count. Goal: the job's rows/s at least 0.85 of the
  encoder's, on runs that alternate (job, encoder, job, ...), so that both see the same load.

The streaming side is `CalibrationJob` (what `flowcore calibrate` runs) on an already loaded flow
and encoder: loading them is a fixed cost per job, not a streaming cost.

- Under load: both streaming jobs again with one busy-loop process on one core. Goal: at most
  1.6x their idle time.

Run: `pytest bench/test_bench_streaming.py`.
"""
import statistics
import time

import numpy as np
import pytest
import torch
from support import busy_core

from flowcore import Encoder, FlowCalibrator
from flowcore.batch.job import CalibrationJob
from flowcore.batch.text_sources import TextCorpus
from flowcore.batch.vector_sources import EmbeddingFile
from flowcore.runtime import job_threads

ROWS = {384: 24_000, 768: 12_000}
IDLE: dict[str, float] = {}
"""Idle median seconds of each streaming job, the loaded runs' reference."""
SENTENCES = 2048
"""Two chunks of the job's default 1024 sentences; each text run takes about 5 s on two 2 GHz cores."""
TEXT_THREADS = job_threads(text=True)
"""A text job's default thread count, the encoder's in both text runs."""
WORDS = ("the a one two people man woman child dog cat car house city road river tree sun rain day night "
         "is are was walks runs sits plays eats reads writes looks big small old new red green quickly slowly "
         "near over under in on at with from into by after before and but or because while").split()


@pytest.fixture(scope="module", params=[384, 768], ids=lambda dim: f"d{dim}")
def embeddings_job(request, tmp_path_factory):
    dim = request.param
    folder = tmp_path_factory.mktemp(f"stream-d{dim}")
    data = np.random.default_rng(0).normal(size=(ROWS[dim], dim)).astype(np.float32)
    np.save(folder / "in.npy", data)
    # fitted briefly: speed, not quality, is measured
    calibrator = FlowCalibrator(batch_size=256, seed=0).fit(data[:512], show_progress_bar=False)
    return dim, folder, data, calibrator


@pytest.mark.benchmark(group="calibrate-npy")
def test_in_memory_transform(benchmark, record, embeddings_job):
    dim, _, data, calibrator = embeddings_job
    benchmark.pedantic(calibrator.transform, args=(data,), rounds=3, warmup_rounds=1)
    median = record(f"calibrate-npy-d{dim}", "in-memory transform")
    record(f"calibrate-npy-d{dim}", "in-memory transform", in_memory_rows_per_s=len(data) / median)


@pytest.mark.benchmark(group="calibrate-npy")
def test_in_memory_transform_job_threads(benchmark, record, embeddings_job):
    dim, _, data, calibrator = embeddings_job
    before = torch.get_num_threads()
    torch.set_num_threads(job_threads(text=False))
    try:
        benchmark.pedantic(calibrator.transform, args=(data,), rounds=3, warmup_rounds=1)
    finally:
        torch.set_num_threads(before)
    record(f"calibrate-npy-d{dim}", f"in-memory transform, {job_threads(text=False)} thread(s)")


@pytest.mark.benchmark(group="calibrate-npy")
def test_streaming_npy_to_npy(benchmark, record, embeddings_job):
    dim, folder, data, calibrator = embeddings_job

    def run():  # restart: each round calibrates again (a finished job would be complete)
        return CalibrationJob(EmbeddingFile(folder / "in.npy"), folder / "out.npy", calibrator.transform, dim,
                              threads=job_threads(text=False), restart=True, show_progress_bar=False).run()

    benchmark.pedantic(run, rounds=3, warmup_rounds=1)
    median = record(f"calibrate-npy-d{dim}", "streaming npy->npy")
    IDLE[f"npy-d{dim}"] = median
    record(f"calibrate-npy-d{dim}", "streaming npy->npy", streaming_rows_per_s=len(data) / median)
    np.testing.assert_allclose(np.load(folder / "out.npy")[:100], calibrator.transform(data[:100]), atol=1e-5)


def test_parquet_bytes_per_row(measure, embeddings_job):
    """The size of the job's parquet output against the raw floats it holds (docs/batch.md: at most 1.05x)."""
    dim, folder, data, calibrator = embeddings_job
    out = folder / "out.parquet"
    CalibrationJob(EmbeddingFile(folder / "in.npy"), out, calibrator.transform, dim, threads=job_threads(text=False),
                   restart=True, show_progress_bar=False).run()
    group = f"parquet output bytes per row, d={dim} float32 (calibrated, default chunks)"
    measure(group, "flowcore calibrate", out.stat().st_size / len(data), "B")
    measure(group, "the raw floats", dim * 4, "B")


@pytest.fixture(scope="module")
def text_job(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stream-text")
    rng = np.random.default_rng(0)
    sentences = [" ".join(rng.choice(WORDS, size=rng.integers(5, 25))) for _ in range(SENTENCES)]
    (folder / "corpus.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    encoder = Encoder(threads=TEXT_THREADS)  # what the job builds for its text (`load_encoder`)
    calibrator = FlowCalibrator(batch_size=256, seed=0).fit(encoder.encode(sentences[:512]), show_progress_bar=False)
    return folder, sentences, encoder, calibrator


def text_job_run(folder, encoder, calibrator):
    """One `flowcore calibrate` text job at its defaults (threads, chunks), started afresh (restart: a finished job
    would be complete)."""
    return CalibrationJob(TextCorpus(folder / "corpus.txt"), folder / "out.npy", calibrator.transform, calibrator.dim,
                          encode=lambda texts: encoder.encode(texts, show_progress_bar=False), threads=TEXT_THREADS,
                          restart=True, show_progress_bar=False).run()


@pytest.mark.benchmark(group="calibrate-text")
def test_encoder_alone_job_threads(benchmark, record, text_job):
    _, sentences, encoder, _ = text_job
    before = torch.get_num_threads()
    torch.set_num_threads(TEXT_THREADS)  # what the job pins
    try:
        benchmark.pedantic(encoder.encode, args=(sentences,), kwargs={"show_progress_bar": False},
                           rounds=3, warmup_rounds=1)
    finally:
        torch.set_num_threads(before)
    median = record("calibrate-text", f"encoder.encode, {TEXT_THREADS} thread(s)")
    IDLE["encoder"] = median
    record("calibrate-text", f"encoder.encode, {TEXT_THREADS} thread(s)",
           encoder_sentences_per_s=len(sentences) / median)


@pytest.mark.benchmark(group="calibrate-text")
def test_streaming_text_to_npy(benchmark, record, text_job):
    folder, sentences, encoder, calibrator = text_job
    benchmark.pedantic(lambda: text_job_run(folder, encoder, calibrator), rounds=3, warmup_rounds=1)
    median = record("calibrate-text", f"streaming txt->npy, {TEXT_THREADS} thread(s) (the default)")
    IDLE["text"] = median
    record("calibrate-text", f"streaming txt->npy, {TEXT_THREADS} thread(s) (the default)",
           streaming_sentences_per_s=len(sentences) / median)


def test_streaming_text_keeps_up_with_its_encoder(goal, text_job):
    folder, sentences, encoder, calibrator = text_job
    runs = {"job": lambda: text_job_run(folder, encoder, calibrator),
            "encoder": lambda: encoder.encode(sentences, show_progress_bar=False)}
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    before = torch.get_num_threads()
    torch.set_num_threads(TEXT_THREADS)  # what the job pins
    try:
        for _ in range(5):
            for name, run in runs.items():
                began = time.perf_counter()
                run()
                seconds[name].append(time.perf_counter() - began)
    finally:
        torch.set_num_threads(before)
    job, alone = (statistics.median(seconds[name]) for name in ("job", "encoder"))
    goal(f"calibrate text at its default {TEXT_THREADS} thread(s): rows/s / the encoder's at the same threads",
         alone / job, 0.85, how=f"{len(sentences) / job:.0f} / {len(sentences) / alone:.0f} sentences/s, medians "
                               f"of 5 alternating runs of {len(sentences)} sentences")


def _loaded_seconds(run, rounds: int = 3) -> float:
    run()  # warm-up, as the idle runs had
    times = []
    with busy_core():
        for _ in range(rounds):
            began = time.perf_counter()
            run()
            times.append(time.perf_counter() - began)
    return statistics.median(times)


def test_streaming_npy_to_npy_with_one_busy_core(record, goal, embeddings_job):
    dim, folder, data, calibrator = embeddings_job
    if f"npy-d{dim}" not in IDLE:
        pytest.skip("needs the idle run (test_streaming_npy_to_npy) first")
    seconds = _loaded_seconds(lambda: CalibrationJob(EmbeddingFile(folder / "in.npy"), folder / "out.npy",
                                                     calibrator.transform, dim, threads=job_threads(text=False),
                                                     restart=True, show_progress_bar=False).run())
    record(f"calibrate-npy-d{dim}", "streaming npy->npy, one busy core", median=seconds)
    goal(f"calibrate npy d={dim}, one busy core: loaded / idle", seconds / IDLE[f"npy-d{dim}"], 1.6, at_most=True,
         how=f"{seconds:.2f} s / {IDLE[f'npy-d{dim}']:.2f} s, {len(data)} rows")


def test_streaming_text_to_npy_with_one_busy_core(record, goal, text_job):
    folder, sentences, encoder, calibrator = text_job
    if "text" not in IDLE:
        pytest.skip("needs the idle run (test_streaming_text_to_npy) first")

    seconds = _loaded_seconds(lambda: text_job_run(folder, encoder, calibrator))
    record("calibrate-text", "streaming txt->npy, one busy core", median=seconds)
    goal("calibrate text, one busy core: loaded / idle", seconds / IDLE["text"], 1.6, at_most=True,
         how=f"{seconds:.2f} s / {IDLE['text']:.2f} s, {len(sentences)} sentences")
