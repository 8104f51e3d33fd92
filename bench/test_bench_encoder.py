"""Encoder throughput: flowcore.Encoder vs sentence-transformers `encode`, same model
(all-MiniLM-L6-v2 from its wheel), same sentences (the 2758 of the STS-B test set, repeats
included), mean pooling, each library with its own defaults. Goal: >= 1.2x sentences/s on CPU.

Group `encoder-cpu` compares the defaults. Group `encoder-cpu-1-thread` (with
FLOWCORE_BENCH_ONE_THREAD=1) runs both with torch limited to one thread: on a loaded shared
machine it separates flowcore's batching (token-sorted batches with a token budget, repeats
encoded once, no pooler) from its CPU thread policy.

Group `encoder-cpu-int8` compares flowcore's fast mode (`Encoder(quantize="int8")`) with
sentence-transformers' int8 ONNX model, made as its users make it
(`export_dynamic_quantized_onnx_model(model, "avx2", path)`, then
`SentenceTransformer(path, backend="onnx", model_kwargs={"file_name": ...})`). Its fp32 ONNX
backend is not timed (2.3x slower than int8 here, and slower than its torch backend). Where
sentence-transformers' ONNX backend cannot be imported (optimum-onnx 0.1 needs transformers
< 4.58, sentence-transformers 6 needs transformers >= 5), the same model is
made by hand: the fp32 graph exported by torch, quantised by ONNX Runtime's quantiser with the
settings of optimum's `AutoQuantizationConfig.avx2(is_static=False)`, and run by ONNX Runtime
inside the SentenceTransformer's own `encode` (tokenisation, batching, pooling), as optimum's
ORTModelForFeatureExtraction does. `test_goals` states the goals from the outputs of the timed
runs: speed ratios, and the STS-B test Spearman (x100, cosine vs gold, mean pooling) of
float32 vs int8.

    FLOWCORE_BENCH_ROUNDS=3 pytest bench/test_bench_encoder.py     # default 2 rounds
"""
import contextlib
import importlib.util
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from flowcore.sts.data import load_split  # noqa: E402
from flowcore.sts.metrics import correlations, cosine_similarity  # noqa: E402
from flowcore.text.encoder import Encoder, default_model_path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STS_DATA = Path(os.environ.get("FLOWCORE_DATA") or REPO.parent / "shared" / "data" / "sts")
ROUNDS = int(os.environ.get("FLOWCORE_BENCH_ROUNDS", "2"))  # 3 rounds: 40 s more of the suite
ONE_THREAD = os.environ.get("FLOWCORE_BENCH_ONE_THREAD") == "1"  # the 1-thread group: opt-in (~70 s)
SETTINGS = ["cpu"] + (["cpu-1-thread"] if ONE_THREAD else []) + (["cuda"] if torch.cuda.is_available() else [])


OUTPUTS: dict[str, np.ndarray] = {}  # "setting/label" -> vectors of the last timed run, for the Spearman goals
MEDIANS: dict[str, float] = {}  # "setting/label" -> median seconds


@pytest.fixture(scope="module")
def pairs():
    return load_split(STS_DATA, "STS-B", "test")


@pytest.fixture(scope="module")
def sentences(pairs) -> list[str]:
    """Both sentences of every STS-B test pair."""
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
        OUTPUTS[f"{setting}/{label}"] = np.asarray(
            benchmark.pedantic(encode, args=(sentences,), rounds=ROUNDS, warmup_rounds=0, iterations=1))
    MEDIANS[f"{setting}/{label}"] = record(f"encoder-{setting}", label,
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


class _OnnxFeatureExtraction(torch.nn.Module):
    """What optimum's ORTModelForFeatureExtraction does on CPU: the ONNX graph in an ONNX Runtime
    session with default options, torch tensors in, `last_hidden_state` out."""

    def __init__(self, path: str, config):
        import onnxruntime

        super().__init__()
        self.config = config
        self.session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        self.names = [node.name for node in self.session.get_inputs()]

    def forward(self, input_ids, attention_mask, token_type_ids=None, **_):
        from transformers.modeling_outputs import BaseModelOutput

        given = {"input_ids": input_ids, "attention_mask": attention_mask,
                 "token_type_ids": torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids}
        states = self.session.run(None, {name: given[name].numpy() for name in self.names})[0]
        return BaseModelOutput(last_hidden_state=torch.from_numpy(states))


def _export_by_hand(folder: Path) -> str:
    """onnx/model_qint8_avx2.onnx (from onnx/model.onnx) as sentence-transformers' export makes it:
    optimum's avx2 dynamic config (QOperator, IntegerOps, uint8 activations and weights, weights
    symmetric per channel, full range, ORT's default dynamic operators)."""
    import onnx
    from onnxruntime.quantization import QuantizationMode, QuantType
    from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer
    from transformers import AutoModel

    class LastHiddenState(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    (folder / "onnx").mkdir()
    fp32, int8 = str(folder / "onnx" / "model.onnx"), str(folder / "onnx" / "model_qint8_avx2.onnx")
    ids = torch.tensor([[101, 7592, 2088, 2003, 102], [101, 7592, 102, 0, 0]])
    batch, length = torch.export.Dim("batch"), torch.export.Dim("sequence")
    with torch.no_grad():
        torch.onnx.export(LastHiddenState(AutoModel.from_pretrained(str(folder)).eval()), (ids, (ids > 0).long(),
                          torch.zeros_like(ids)), fp32, input_names=["input_ids", "attention_mask", "token_type_ids"],
                          output_names=["last_hidden_state"], dynamic_shapes=[{0: batch, 1: length}] * 3, dynamo=True,
                          external_data=False, verbose=False)
    quantizer = ONNXQuantizer(onnx.load(fp32), per_channel=True, reduce_range=False, mode=QuantizationMode.IntegerOps,
                              static=False, weight_qType=QuantType.QUInt8, activation_qType=QuantType.QUInt8,
                              tensors_range=None, nodes_to_quantize=[], nodes_to_exclude=[],
                              op_types_to_quantize=["Conv", "MatMul", "Attention", "LSTM", "Gather", "Transpose",
                                                    "EmbedLayerNormalization"],
                              extra_options={"WeightSymmetric": True, "ActivationSymmetric": False,
                                             "EnableSubgraph": False, "ForceSymmetric": False})
    quantizer.quantize_model()
    quantizer.model.save_model_to_file(int8, False)
    return int8


@pytest.fixture(scope="module")
def st_onnx(tmp_path_factory) -> dict:
    """sentence-transformers with its int8 (avx2) ONNX model, and how it was made."""
    import shutil

    from sentence_transformers import SentenceTransformer

    folder = tmp_path_factory.mktemp("st-onnx") / "model"
    shutil.copytree(default_model_path(), folder)
    if importlib.util.find_spec("optimum") is not None and importlib.util.find_spec("optimum.onnxruntime"):
        from sentence_transformers import export_dynamic_quantized_onnx_model

        fp32 = SentenceTransformer(str(folder), backend="onnx", device="cpu")
        export_dynamic_quantized_onnx_model(fp32, "avx2", str(folder))
        int8 = SentenceTransformer(str(folder), backend="onnx", device="cpu",
                                   model_kwargs={"file_name": "onnx/model_qint8_avx2.onnx"})
        return {"int8": int8, "made_by": "sentence-transformers"}
    int8 = SentenceTransformer(str(folder), device="cpu")
    int8[0].model = _OnnxFeatureExtraction(_export_by_hand(folder), int8[0].model.config)
    return {"int8": int8, "made_by": "by hand (sentence-transformers' ONNX backend does not import here)"}


def _flowcore_int8(_):
    encoder = Encoder(pooling="mean", quantize="int8")
    return lambda texts: encoder.encode(texts, show_progress_bar=False)


INT8_ENGINES = ("st-onnx-int8", "flowcore-int8")  # back to back


@pytest.mark.parametrize("engine", INT8_ENGINES)
def test_int8_throughput(benchmark, record, engine, sentences, st_onnx):
    if engine == "flowcore-int8":
        encode = _flowcore_int8("cpu")
    else:
        model = st_onnx["int8"]
        encode = lambda texts: model.encode(texts, show_progress_bar=False)  # noqa: E731
    _throughput(benchmark, record, "cpu-int8", engine, encode, sentences)
    benchmark.extra_info["st_onnx_made_by"] = st_onnx["made_by"]


def _spearman(vectors: np.ndarray, pairs) -> float:
    half = len(pairs.sentences1)
    return correlations(cosine_similarity(vectors[:half], vectors[half:]), pairs.scores)["spearman"]


def test_goals(goal, pairs):
    """The goals, from the timed runs above: speeds from their medians, Spearman from their vectors."""
    needed = ["cpu/flowcore", "cpu/sentence-transformers"] + [f"cpu-int8/{engine}" for engine in INT8_ENGINES]
    if not set(needed) <= MEDIANS.keys():
        pytest.skip("needs the cpu throughput runs of this file")
    goal("encoder fp32: flowcore / fastest sentence-transformers fp32 (torch)",
         MEDIANS["cpu/sentence-transformers"] / MEDIANS["cpu/flowcore"], 1.2, how="sentences/s, CPU defaults")
    goal("encoder int8: flowcore int8 / sentence-transformers int8 ONNX",
         MEDIANS["cpu-int8/st-onnx-int8"] / MEDIANS["cpu-int8/flowcore-int8"], 1.2,
         how="sentences/s, CPU defaults, avx2 int8 ONNX export")
    spearman = {label: _spearman(OUTPUTS[label], pairs)
                for label in ("cpu/flowcore", "cpu-int8/flowcore-int8", "cpu-int8/st-onnx-int8")}
    goal("encoder int8: STS-B Spearman cost of flowcore int8",
         spearman["cpu/flowcore"] - spearman["cpu-int8/flowcore-int8"], 0.2, at_most=True,
         how=f"x100, mean pooling: fp32 {spearman['cpu/flowcore']:.2f}, int8 {spearman['cpu-int8/flowcore-int8']:.2f}"
             f", sentence-transformers int8 ONNX {spearman['cpu-int8/st-onnx-int8']:.2f}")
