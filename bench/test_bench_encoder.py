"""Encoder throughput: flowcore.Encoder vs sentence-transformers `encode`, same model
(all-MiniLM-L6-v2 from its wheel), same sentences (the 2758 of the STS-B test set, repeats
included), mean pooling, each library with its own defaults. Goal: >= 1.2x sentences/s on CPU.
A third entry runs sentence-transformers with torch limited to one thread: on a loaded shared
machine it separates flowcore's CPU thread policy from its batching (token-sorted batches,
repeats encoded once) in the ratio.

    pytest bench/test_bench_encoder.py            # FLOWCORE_BENCH_ROUNDS=3 by default
"""
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from flowcore.encoder import Encoder, default_model_path  # noqa: E402

STS_DATA = Path(os.environ.get("FLOWCORE_DATA") or Path(__file__).resolve().parents[1].parent / "shared" / "data" / "sts")
ROUNDS = int(os.environ.get("FLOWCORE_BENCH_ROUNDS", "3"))
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    """Both sentences of every STS-B test pair (tab-separated, no quoting: columns 5 and 6)."""
    path = STS_DATA / "STSBenchmark" / "sts-test.csv"
    if not path.is_file():
        pytest.fail(f"STS-B test file not found at {path}; set FLOWCORE_DATA")
    rows = [line.rstrip("\n").split("\t") for line in path.read_text(encoding="utf-8").splitlines()]
    return [row[5] for row in rows] + [row[6] for row in rows]


def _throughput(benchmark, record, device, label, encode, sentences):
    encode(sentences[:64])  # load kernels and caches outside the timing
    benchmark.pedantic(encode, args=(sentences,), rounds=ROUNDS, warmup_rounds=0, iterations=1)
    record(f"encoder-{device}", label,
           **{f"{label}_sentences_per_s": round(len(sentences) / benchmark.stats.stats.median, 1),
              f"{label}_load_avg_1min": round(os.getloadavg()[0], 1), "sentences": len(sentences)})


@pytest.mark.parametrize("device", DEVICES)
def test_flowcore_encoder(benchmark, record, device, sentences):
    encoder = Encoder(pooling="mean", device=device)
    _throughput(benchmark, record, device, "flowcore",
                lambda texts: encoder.encode(texts, show_progress_bar=False), sentences)


@pytest.mark.parametrize("device", DEVICES)
def test_sentence_transformers(benchmark, record, device, sentences):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(default_model_path(), device=device)
    _throughput(benchmark, record, device, "sentence-transformers",
                lambda texts: model.encode(texts, show_progress_bar=False), sentences)


def test_sentence_transformers_one_thread(benchmark, record, sentences):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(default_model_path(), device="cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _throughput(benchmark, record, "cpu", "sentence-transformers-1-thread",
                    lambda texts: model.encode(texts, show_progress_bar=False), sentences)
    finally:
        torch.set_num_threads(threads)
