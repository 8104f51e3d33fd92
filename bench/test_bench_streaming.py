"""Streaming calibration suite.

- npy -> npy at d = 384 and 768: `flowcore calibrate`'s job (memory-mapped reads, chunked
  fsynced writes, progress-file commits) against in-memory `FlowCalibrator.transform` on the same
  flow and rows. Goal: >= 80 % of the in-memory speed (time ratio <= 1.25). The job computes
  on one thread fewer than torch's default (a core for reading and writing), so the in-memory
  transform is also timed with that thread count.
- Text: a txt corpus through the job (reading, encoding, flow, writing) against the encoder's
  own `encode` on the same sentences with the same thread count. Goal: within 5 % (ratio <= 1.05).
  The encoder with its default load-adaptive threads is recorded alongside.

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
SENTENCES = 384
"""Each text run takes 4-5 s on a 2 GHz core (four runs a test)."""
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

    def run():
        return CalibrationJob(EmbeddingFile(folder / "in.npy"), folder / "out.npy", calibrator.transform, dim,
                              threads=job_threads(text=False), show_progress_bar=False).run()

    benchmark.pedantic(run, rounds=3, warmup_rounds=1)
    median = record(f"calibrate-npy-d{dim}", "streaming npy->npy")
    IDLE[f"npy-d{dim}"] = median
    record(f"calibrate-npy-d{dim}", "streaming npy->npy", streaming_rows_per_s=len(data) / median)
    np.testing.assert_allclose(np.load(folder / "out.npy")[:100], calibrator.transform(data[:100]), atol=1e-5)


@pytest.fixture(scope="module")
def text_job(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stream-text")
    rng = np.random.default_rng(0)
    sentences = [" ".join(rng.choice(WORDS, size=rng.integers(5, 25))) for _ in range(SENTENCES)]
    (folder / "corpus.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    encoder = Encoder()
    calibrator = FlowCalibrator(batch_size=256, seed=0).fit(encoder.encode(sentences[:512]), show_progress_bar=False)
    return folder, sentences, encoder, calibrator


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.benchmark(group="calibrate-text")
def test_encoder_alone_one_thread(benchmark, record, text_job, one_thread):
    _, sentences, encoder, _ = text_job
    benchmark.pedantic(encoder.encode, args=(sentences,), kwargs={"show_progress_bar": False},
                       rounds=3, warmup_rounds=1)
    median = record("calibrate-text", "encoder.encode, 1 thread")
    record("calibrate-text", "encoder.encode, 1 thread", encoder_sentences_per_s=len(sentences) / median)


@pytest.mark.benchmark(group="calibrate-text")
def test_streaming_text_to_npy(benchmark, record, text_job):
    folder, sentences, encoder, calibrator = text_job

    def encode(texts):
        return encoder.encode(texts, show_progress_bar=False)

    def run():  # the job's default for text: 1 thread (bit-reproducible resume)
        return CalibrationJob(TextCorpus(folder / "corpus.txt"), folder / "out.npy", calibrator.transform,
                              calibrator.dim, encode=encode, threads=job_threads(text=True),
                                                                                     show_progress_bar=False).run()

    benchmark.pedantic(run, rounds=3, warmup_rounds=1)
    median = record("calibrate-text", "streaming txt->npy, 1 thread")
    IDLE["text"] = median
    record("calibrate-text", "streaming txt->npy, 1 thread", streaming_sentences_per_s=len(sentences) / median)


@pytest.mark.benchmark(group="calibrate-text")
def test_encoder_alone_adaptive_threads(benchmark, record, text_job):
    _, sentences, encoder, _ = text_job
    benchmark.pedantic(encoder.encode, args=(sentences,), kwargs={"show_progress_bar": False},
                       rounds=3, warmup_rounds=1)
    record("calibrate-text", "encoder.encode, adaptive threads")


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
                                                     show_progress_bar=False).run())
    record(f"calibrate-npy-d{dim}", "streaming npy->npy, one busy core", median=seconds)
    goal(f"calibrate npy d={dim}, one busy core: loaded / idle", seconds / IDLE[f"npy-d{dim}"], 1.6, at_most=True,
         how=f"{seconds:.2f} s / {IDLE[f'npy-d{dim}']:.2f} s, {len(data)} rows")


def test_streaming_text_to_npy_with_one_busy_core(record, goal, text_job):
    folder, sentences, encoder, calibrator = text_job
    if "text" not in IDLE:
        pytest.skip("needs the idle run (test_streaming_text_to_npy) first")

    def run():
        return CalibrationJob(TextCorpus(folder / "corpus.txt"), folder / "out.npy", calibrator.transform,
                              calibrator.dim, encode=lambda texts: encoder.encode(texts, show_progress_bar=False),
                              threads=job_threads(text=True), show_progress_bar=False).run()

    seconds = _loaded_seconds(run)
    record("calibrate-text", "streaming txt->npy, one busy core", median=seconds)
    goal("calibrate text, one busy core: loaded / idle", seconds / IDLE["text"], 1.6, at_most=True,
         how=f"{seconds:.2f} s / {IDLE['text']:.2f} s, {len(sentences)} sentences")
