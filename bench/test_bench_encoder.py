"""Encoder throughput: flowcore.Encoder vs sentence-transformers `encode`, same model
(all-MiniLM-L6-v2 from its wheel), same sentences (the 2758 of the STS-B test set, repeats
included), mean pooling, each library with its own defaults. Goal: >= 1.2x sentences/s on CPU.

Group `encoder-cpu` compares the defaults. Group `encoder-cpu-1-thread` runs both with torch
limited to one thread: on a loaded shared machine it separates flowcore's batching (token-sorted
batches with a token budget, repeats encoded once, no pooler) from its CPU thread policy.

    FLOWCORE_BENCH_ROUNDS=3 pytest bench/test_bench_encoder.py
"""
import contextlib
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from flowcore.sts.data import load_split  # noqa: E402
from flowcore.text.encoder import Encoder, default_model_path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STS_DATA = Path(os.environ.get("FLOWCORE_DATA") or REPO.parent / "shared" / "data" / "sts")
ROUNDS = int(os.environ.get("FLOWCORE_BENCH_ROUNDS", "3"))
SETTINGS = ["cpu", "cpu-1-thread"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    """Both sentences of every STS-B test pair."""
    pairs = load_split(STS_DATA, "STS-B", "test")
    return list(pairs.sentences1) + list(pairs.sentences2)


@contextlib.contextmanager
def _torch_threads(setting: str):
    threads = torch.get_num_threads()
    if setting.endswith("-1-thread"):
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _throughput(benchmark, record, setting, label, encode, sentences):
    with _torch_threads(setting):
        encode(sentences[:64])  # load kernels and caches outside the timing
        benchmark.pedantic(encode, args=(sentences,), rounds=ROUNDS, warmup_rounds=0, iterations=1)
    record(f"encoder-{setting}", label,
           **{f"{label}_sentences_per_s": round(len(sentences) / benchmark.stats.stats.median, 1),
              f"{label}_load_avg_1min": round(os.getloadavg()[0], 1), "sentences": len(sentences)})


def _flowcore(device):
    encoder = Encoder(pooling="mean", device=device)
    return lambda texts: encoder.encode(texts, show_progress_bar=False)


def _sentence_transformers(device):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(default_model_path(), device=device)
    return lambda texts: model.encode(texts, show_progress_bar=False)


LIBRARIES = {"flowcore": _flowcore, "sentence-transformers": _sentence_transformers}


# Each setting's two libraries run back to back, so a shared machine's load drifts less between them.
@pytest.mark.parametrize("setting, library", [(setting, library) for setting in SETTINGS for library in LIBRARIES])
def test_encode_throughput(benchmark, record, setting, library, sentences):
    encode = LIBRARIES[library](setting.removesuffix("-1-thread"))
    _throughput(benchmark, record, setting, library, encode, sentences)
