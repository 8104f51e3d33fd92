"""Streaming calibration suite.

- npy -> npy at d = 384 and 768: `flowcore calibrate`'s job (memory-mapped reads, chunked
  fsynced writes, manifest commits) against in-memory `FlowCalibrator.transform` on the same
  flow and rows. Goal: >= 80 % of the in-memory speed (time ratio <= 1.25).
- Text: a txt corpus through the job (reading, encoding, flow, writing) against the encoder's
  own `encode` on the same sentences with the same thread count. Goal: within 5 % (ratio <= 1.05).
  The encoder with its default load-adaptive threads is recorded alongside.

Run: `pytest bench/test_bench_streaming.py`.
"""
import numpy as np
import pytest
import torch

from flowcore import Encoder, FlowCalibrator
from flowcore.streaming import calibrate_file

ROWS = {384: 40_000, 768: 20_000}
SENTENCES = 1024
WORDS = ("the a one two people man woman child dog cat car house city road river tree sun rain day night "
         "is are was walks runs sits plays eats reads writes looks big small old new red green quickly slowly "
         "near over under in on at with from into by after before and but or because while").split()


def fitted_flow(folder, data: np.ndarray):
    """A flow fitted briefly (a couple of steps: speed, not quality, is measured) and saved."""
    calibrator = FlowCalibrator(batch_size=256, seed=0).fit(data[:512], progress=False)
    path = folder / "model.flow"
    calibrator.save(path)
    return path, FlowCalibrator.load(path)


@pytest.fixture(scope="module", params=[384, 768], ids=lambda dim: f"d{dim}")
def embeddings_job(request, tmp_path_factory):
    dim = request.param
    folder = tmp_path_factory.mktemp(f"stream-d{dim}")
    data = np.random.default_rng(0).normal(size=(ROWS[dim], dim)).astype(np.float32)
    np.save(folder / "in.npy", data)
    flow_path, calibrator = fitted_flow(folder, data)
    return dim, folder, data, flow_path, calibrator


@pytest.mark.benchmark(group="calibrate-npy")
def test_in_memory_transform(benchmark, record, embeddings_job):
    dim, _, data, _, calibrator = embeddings_job
    benchmark.pedantic(calibrator.transform, args=(data,), rounds=3, warmup_rounds=1)
    median = record(f"calibrate-npy-d{dim}", "in-memory transform")
    record(f"calibrate-npy-d{dim}", "in-memory transform", in_memory_rows_per_s=len(data) / median)


@pytest.mark.benchmark(group="calibrate-npy")
def test_streaming_npy_to_npy(benchmark, record, embeddings_job):
    dim, folder, data, flow_path, calibrator = embeddings_job

    def run():
        return calibrate_file(flow_path, folder / "out.npy", embeddings=folder / "in.npy", progress=False)

    benchmark.pedantic(run, rounds=3, warmup_rounds=1)
    median = record(f"calibrate-npy-d{dim}", "streaming npy->npy")
    record(f"calibrate-npy-d{dim}", "streaming npy->npy", streaming_rows_per_s=len(data) / median)
    np.testing.assert_allclose(np.load(folder / "out.npy")[:100], calibrator.transform(data[:100]), atol=1e-5)


@pytest.fixture(scope="module")
def text_job(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stream-text")
    rng = np.random.default_rng(0)
    sentences = [" ".join(rng.choice(WORDS, size=rng.integers(5, 25))) for _ in range(SENTENCES)]
    (folder / "corpus.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    encoder = Encoder()
    calibrator = FlowCalibrator(batch_size=256, seed=0).fit(encoder.encode(sentences[:512]), progress=False)
    calibrator.metadata = {"encoder": encoder.model_id, "pooling": encoder.pooling}
    calibrator.save(folder / "text.flow")
    return folder, sentences, encoder


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.benchmark(group="calibrate-text")
def test_encoder_alone_one_thread(benchmark, record, text_job, one_thread):
    _, sentences, encoder = text_job
    benchmark.pedantic(encoder.encode, args=(sentences,), kwargs={"show_progress_bar": False},
                       rounds=3, warmup_rounds=1)
    median = record("calibrate-text", "encoder.encode, 1 thread")
    record("calibrate-text", "encoder.encode, 1 thread", encoder_sentences_per_s=len(sentences) / median)


@pytest.mark.benchmark(group="calibrate-text")
def test_streaming_text_to_npy(benchmark, record, text_job):
    folder, sentences, _ = text_job

    def run():  # the job's default for text: 1 thread (bit-reproducible resume)
        return calibrate_file(folder / "text.flow", folder / "out.npy", input=folder / "corpus.txt", progress=False)

    benchmark.pedantic(run, rounds=3, warmup_rounds=1)
    median = record("calibrate-text", "streaming txt->npy, 1 thread")
    record("calibrate-text", "streaming txt->npy, 1 thread", streaming_sentences_per_s=len(sentences) / median)


@pytest.mark.benchmark(group="calibrate-text")
def test_encoder_alone_adaptive_threads(benchmark, record, text_job):
    _, sentences, encoder = text_job
    benchmark.pedantic(encoder.encode, args=(sentences,), kwargs={"show_progress_bar": False},
                       rounds=3, warmup_rounds=1)
    record("calibrate-text", "encoder.encode, adaptive threads")
