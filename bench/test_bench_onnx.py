"""The exported ONNX graph (`flowcore export --format onnx`) on ONNX Runtime against flowcore's own path and
against sentence-transformers' ONNX backend with the same calibration applied in torch: sentences/s on the
CPU, and what int8 costs on STS-B.

Same model (all-MiniLM-L6-v2 from its wheel), mean pooling, tempered whitening (γ = ¼, the calibration
docs/calibration.md recommends for this encoder) fitted on STS-B's train sentences; the timed sentences are
the 2758 of the STS-B test set (both sides of every pair, repeats included). The engines:

- `flowcore`: `Encoder(pooling="mean").encode(texts)` then `whitening.transform`, flowcore's defaults;
- `onnx-float` / `onnx-int8`: the folder's tokenizer.json and model.onnx (float32, or `--quantize int8`) in an
  ONNX Runtime session with default options, as docs/deploy.md runs them, in batches of 64 texts of similar
  length (what a service does with a queue; flowcore's Encoder batches likewise);
- `st-onnx`: the `--format st` folder loaded as sentence-transformers' users load it (`SentenceTransformer`,
  its own tokenisation, batching and pooling, the whitening as its stock Dense layer in torch), its
  transformer run by ONNX Runtime on the folder's onnx/model.onnx as optimum's ORTModelForFeatureExtraction
  does (optimum itself cannot be installed beside transformers 5: `test_bench_encoder._OnnxFeatureExtraction`).

The engines run in the same process, interleaved round by round; min and median are reported. The STS-B
Spearman (x100, cosine vs gold) of each engine's vectors states the int8 cost.

    FLOWCORE_BENCH_ROUNDS=5 pytest bench/test_bench_onnx.py -s      # default 3 rounds
"""
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("onnxruntime")
pytest.importorskip("sentence_transformers")

import flowcore  # noqa: E402
from flowcore.sts.data import load_split  # noqa: E402
from flowcore.sts.metrics import correlations, cosine_similarity  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STS_DATA = Path(os.environ.get("FLOWCORE_DATA") or REPO.parent / "shared" / "data" / "sts")
ROUNDS = int(os.environ.get("FLOWCORE_BENCH_ROUNDS", "3"))
BATCH = 64


@pytest.fixture(scope="module")
def pairs():
    return load_split(STS_DATA, "STS-B", "test")


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """{label: encode(texts) -> float32 vectors}, each built as its users build it."""
    import onnxruntime
    from test_bench_encoder import _OnnxFeatureExtraction
    from tokenizers import Tokenizer

    from flowcore.integrations import onnx as flowcore_onnx
    from flowcore.integrations import sentence_transformers as fst

    train = load_split(STS_DATA, "STS-B", "train")
    fit = list(dict.fromkeys(list(train.sentences1) + list(train.sentences2)))
    encoder = flowcore.Encoder(pooling="mean")
    whitening = flowcore.Whitening(power=0.25).fit(encoder.encode(fit, show_progress_bar=False), encoder=encoder)
    root = tmp_path_factory.mktemp("onnx-bench")
    flowcore_onnx.export(root / "float", whitening)
    flowcore_onnx.export(root / "int8", whitening, quantize="int8")
    fst.export(root / "st", whitening)

    def graph(folder):
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        runtime = onnxruntime.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
        names = [node.name for node in runtime.get_inputs()]
        columns = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}

        def encode(texts):
            order = np.argsort([-len(text) for text in texts], kind="stable")
            out = np.empty((len(texts), whitening.output_dim), dtype=np.float32)
            for start in range(0, len(texts), BATCH):
                rows = order[start:start + BATCH]
                encoded = tokenizer.encode_batch([texts[row] for row in rows])
                feed = {name: np.array([getattr(e, columns[name]) for e in encoded], dtype=np.int64) for name in names}
                out[rows] = runtime.run(None, feed)[0]
            return out
        return encode

    from sentence_transformers import SentenceTransformer

    st_model = SentenceTransformer(str(root / "st"), device="cpu")
    st_model[0].model = _OnnxFeatureExtraction(str(root / "st" / fst.ONNX_GRAPH), st_model[0].model.config)
    return {
        "flowcore": lambda texts: whitening.transform(encoder.encode(texts, show_progress_bar=False)),
        "onnx-float": graph(root / "float"),
        "onnx-int8": graph(root / "int8"),
        "st-onnx": lambda texts: st_model.encode(texts, show_progress_bar=False, batch_size=BATCH),
    }


def _spearman(vectors: np.ndarray, pairs) -> float:
    half = len(pairs.sentences1)
    return correlations(cosine_similarity(vectors[:half], vectors[half:]), pairs.scores)["spearman"]


def test_onnx_export_throughput_and_int8_cost(engines, pairs, record, measure, goal):
    texts = list(pairs.sentences1) + list(pairs.sentences2)
    times = {label: [] for label in engines}
    outputs = {}
    for encode in engines.values():
        encode(texts[:64])  # sessions, kernels and caches outside the timing
    for _ in range(ROUNDS):  # interleaved: every engine once per round
        for label, encode in engines.items():
            started = time.perf_counter()
            outputs[label] = np.asarray(encode(texts))
            times[label].append(time.perf_counter() - started)
    for label, seconds in times.items():
        record("onnx-export-cpu", label, median=float(np.median(seconds)), sentences=len(texts))
        measure("onnx-export-cpu sentences/s", f"{label} median", len(texts) / np.median(seconds), "sentences/s")
        measure("onnx-export-cpu sentences/s", f"{label} best", len(texts) / np.min(seconds), "sentences/s")
    median = {label: float(np.median(seconds)) for label, seconds in times.items()}
    spearman = {label: _spearman(vectors, pairs) for label, vectors in outputs.items()}
    for label, value in spearman.items():
        measure("onnx-export STS-B Spearman x100", label, value, "")
    float_gap = np.abs(outputs["onnx-float"] - outputs["flowcore"]).max()
    goal("onnx export float: ONNX graph / flowcore encoder + calibrator", median["flowcore"] / median["onnx-float"],
         1.0, how=f"sentences/s, {len(texts)} STS-B test sentences, mean pooling + whitening; largest difference "
         f"{float_gap:.1e}")
    goal("onnx export float: ONNX graph / sentence-transformers ONNX backend + torch calibration",
         median["st-onnx"] / median["onnx-float"], 1.0, how="sentences/s, same graph body, batches of 64")
    goal("onnx export int8: ONNX int8 graph / ONNX float graph", median["onnx-float"] / median["onnx-int8"], 1.2,
         how="sentences/s")
    goal("onnx export int8: STS-B Spearman cost of the int8 graph", spearman["onnx-float"] - spearman["onnx-int8"],
         0.2, at_most=True, how=f"x100, mean pooling + whitening γ=¼: float {spearman['onnx-float']:.2f}, "
         f"int8 {spearman['onnx-int8']:.2f}, flowcore {spearman['flowcore']:.2f}")
