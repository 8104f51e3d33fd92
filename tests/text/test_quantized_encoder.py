"""Encoder(quantize="int8"): close to float32 on a tiny random BERT, every pooling depth served,
quantised graphs built once, clear errors, recorded by describe(), kept apart in the embedding
cache, and `--quantize` on every subcommand that encodes."""
import sys

import numpy as np
import pytest
import torch

import flowcore.text.quantize as quantize
from flowcore.text.cache import EmbeddingCache
from flowcore.text.encoder import Encoder

from helpers.tiny_models import WORDS, save_tiny_bert

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")



@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"), WORDS, hidden_size=32, num_layers=3)


@pytest.fixture(scope="module")
def sentences():
    rng = np.random.default_rng(0)
    return [" ".join(rng.choice(WORDS, size=rng.integers(1, 30))) for _ in range(40)] + ["", "the cat"]


def _cosines(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize("pooling", ["mean", "first-last-avg", "cls", "layers=1"])
def test_int8_is_close_to_float32_but_not_it(tiny_bert, sentences, pooling):
    fp32 = Encoder(tiny_bert, pooling=pooling).encode(sentences)
    int8 = Encoder(tiny_bert, pooling=pooling, quantize="int8").encode(sentences)
    assert int8.shape == fp32.shape and int8.dtype == np.float32
    assert _cosines(fp32, int8).min() > 0.99
    assert np.abs(fp32 - int8).max() > 1e-6  # the int8 graph ran, not the float32 model


def test_int8_keeps_dedupe_order_and_threads(tiny_bert, sentences):
    encoder = Encoder(tiny_bert, pooling="mean", quantize="int8", threads=1)
    once = encoder.encode(sentences)
    shuffled = encoder.encode(sentences[::-1] + sentences[:3])
    assert np.array_equal(encoder.encode(sentences), once)  # same call, same thread count: same bits
    assert _cosines(shuffled[:len(sentences)][::-1], once).min() > 0.999  # batch-mates move it by int8 steps only
    assert np.array_equal(shuffled[len(sentences):], shuffled[len(sentences) - 1:len(sentences) - 4:-1])


def test_second_encoder_reuses_the_quantised_graph(tiny_bert, tmp_path, monkeypatch):
    first = Encoder(tiny_bert, pooling="last2-avg", quantize="int8")
    builds = []
    monkeypatch.setattr(quantize, "cpu_flags", lambda: builds.append(1) or set())  # read once per build
    assert Encoder(tiny_bert, pooling="layers=1", quantize="int8")._quantized is first._quantized
    assert builds == []  # any pooling, the same graph
    other = save_tiny_bert(tmp_path / "other", WORDS, hidden_size=32, num_layers=2)
    Encoder(other, quantize="int8")
    assert len(builds) == 1  # another model: another graph


def test_describe_records_the_mode(tiny_bert):
    fp32 = Encoder(tiny_bert, pooling="mean").describe()
    assert fp32["quantize"] is None and fp32["attention"] == "sdpa"
    described = Encoder(tiny_bert, pooling="mean", quantize="int8").describe()
    assert described["quantize"] == "int8" and described["dtype"] == "float32"
    assert described["attention"] is None  # ONNX Runtime runs the model, not torch's attention
    assert described["engine"].startswith("onnxruntime==") and "int8" in described["engine"]
    assert "quantize='int8'" in repr(Encoder(tiny_bert, pooling="mean", quantize="int8"))


@pytest.mark.parametrize("options, message", [
    ({"quantize": "int4"}, "one of int8"),
    ({"quantize": True}, "one of int8"),
    ({"quantize": "int8", "dtype": "bfloat16"}, "float32"),
])
def test_bad_values_are_refused(tiny_bert, options, message):
    with pytest.raises(ValueError, match=message):
        Encoder(tiny_bert, **options)


def test_cuda_is_refused():
    with pytest.raises(ValueError, match="CPU mode"):
        quantize.check_quantize("int8", torch.device("cuda"), None)


def test_missing_onnxruntime_names_the_extra(tiny_bert, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime.quantization", None)
    with pytest.raises(ImportError, match=r"flowcore\[onnx\]"):
        quantize.load_quantized.__wrapped__(tiny_bert, ("input_ids", "attention_mask"), 3)  # uncached


@pytest.mark.parametrize("flags, weights", [
    ({"avx2", "fma"}, "uint8"), ({"avx2", "avx512f"}, "uint8"), ({"avx512f", "avx512_vnni"}, "int8"),
    ({"avx_vnni"}, "int8"), (set(), "uint8"),
])
def test_weights_follow_the_cpu(flags, weights):
    assert quantize.weight_type(flags) == weights


def test_cache_keeps_int8_apart(tiny_bert, sentences, tmp_path):
    fp32, int8 = Encoder(tiny_bert, pooling="mean"), Encoder(tiny_bert, pooling="mean", quantize="int8")
    cache = EmbeddingCache(tmp_path)
    from_fp32, from_int8 = cache.embed(fp32, sentences, show_progress_bar=False), cache.embed(int8, sentences,
                                                                                              show_progress_bar=False)
    assert len([folder for folder in tmp_path.iterdir() if folder.is_dir()]) == 2
    assert np.array_equal(from_fp32, fp32.encode(sentences)) and np.array_equal(from_int8, int8.encode(sentences))
    reread = EmbeddingCache(tmp_path).embed(int8, sentences, show_progress_bar=False)
    assert np.array_equal(reread, from_int8)


@pytest.mark.parametrize("argv", [
    ["encode", "--input", "in.txt", "--out", "out.npy"],
    ["calibrate", "--calibrator", "flow.pt", "--input", "in.txt", "--out", "out.npy"],
    ["sts"],
    ["analyze", "--corpus", "corpus.txt", "--out", "report"],
])
def test_cli_parses_quantize(argv, capsys):
    from flowcore.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(argv).quantize is None
    assert parser.parse_args([*argv, "--quantize", "int8"]).quantize == "int8"
    with pytest.raises(SystemExit):
        parser.parse_args([*argv, "--quantize", "int4"])
    assert "invalid choice" in capsys.readouterr().err


def test_quantize_help_names_the_extra_and_no_figures():
    from flowcore.cli.arguments import QUANTIZE_HELP

    assert "flowcore[onnx]" in QUANTIZE_HELP and "{" not in QUANTIZE_HELP
    assert not any(c.isdigit() for c in QUANTIZE_HELP.replace("int8", "").replace("float32", ""))  # no figures
