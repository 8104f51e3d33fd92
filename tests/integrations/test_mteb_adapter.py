"""flowcore.integrations.mteb: the adapter against mteb's own code, offline.

MTEB's STSBenchmark task (its AbsTaskSTS, AnySTSEvaluator and scoring) runs through `mteb.evaluate`
on the local STS-B test pairs (the task's dataset is set in memory, never downloaded), with the
adapter around the default encoder; its cosine Spearman must equal `flowcore sts`'s
(`flowcore.sts.evaluate`) on the same vectors, raw and whitened. The default encoder encodes each
distinct sentence once for the whole module (`Recorded`), so both sides see the very same vectors.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # mteb must never download a dataset (conftest: hub offline)

mteb = pytest.importorskip("mteb")

from datasets import Dataset  # noqa: E402
from mteb._create_dataloaders import create_dataloader  # noqa: E402
from mteb.models import EncoderProtocol, ModelMeta  # noqa: E402

import flowcore  # noqa: E402
from flowcore._fs import file_sha256  # noqa: E402
from flowcore.integrations.mteb import FlowcoreMTEBModel  # noqa: E402
from flowcore.sts import evaluate, load_split, read_sentence_file  # noqa: E402
from flowcore.sts.metrics import cosine_similarity  # noqa: E402

README_FIRST_LAST_AVG_STSB = 81.55  # README table: default first-last-avg, STS-B, no calibration
ENCODE_KWARGS = {"batch_size": 48, "show_progress_bar": False}


class Recorded:
    """The default Encoder, keeping each sentence's vector once computed (and the batch sizes asked for)."""

    def __init__(self, encoder):
        self.encoder = encoder
        self.model_id, self.pooling, self.dim, self.max_length = (encoder.model_id, encoder.pooling, encoder.dim,
                                                                  encoder.max_length)
        self.vectors: dict[str, np.ndarray] = {}
        self.batch_sizes: list[int] = []

    def encode(self, sentences, batch_size=64, show_progress_bar=None):
        self.batch_sizes.append(batch_size)
        missing = [s for s in dict.fromkeys(sentences) if s not in self.vectors]
        if missing:
            self.vectors.update(zip(missing, self.encoder.encode(missing, batch_size=batch_size,
                                                                 show_progress_bar=False)))
        return np.stack([self.vectors[s] for s in sentences])


@pytest.fixture(scope="module")
def encoder():
    return flowcore.Encoder(pooling="first-last-avg")


@pytest.fixture(scope="module")
def recorded(encoder):
    return Recorded(encoder)


@pytest.fixture(scope="module")
def stsb(sts_data_dir):
    return load_split(sts_data_dir, "STS-B", "test")


def stsb_task(pairs, monkeypatch):
    """mteb's STSBenchmark task holding the local test pairs; loading its data would be an error."""
    task = mteb.get_task("STSBenchmark")
    task.dataset = {"default": {"test": Dataset.from_dict({"sentence1": pairs.sentences1,
                                                           "sentence2": pairs.sentences2,
                                                           "score": [float(s) for s in pairs.scores]})}}
    task.data_loaded = True

    def no_download(*args, **kwargs):
        raise AssertionError("mteb tried to load the task's dataset")

    monkeypatch.setattr(task, "load_data", no_download)
    return task


def mteb_scores(model, task) -> dict:
    result = mteb.evaluate(model, task, cache=None, encode_kwargs=dict(ENCODE_KWARGS), show_progress_bar=False,
                           co2_tracker=False, overwrite_strategy="always")
    assert not result.exceptions
    (task_result,) = result.task_results
    (scores,) = task_result.scores["test"]
    return scores


def loader(texts, batch_size=4):
    data = Dataset.from_dict({"text": list(texts)})
    return create_dataloader(data, task_metadata=mteb.get_task("STSBenchmark").metadata, batch_size=batch_size)


@pytest.mark.filterwarnings("ignore:The task 'STSBenchmark' is superseded")
def test_mteb_sts_evaluator_equals_flowcore_sts_without_calibration(recorded, stsb, sts_data_dir, monkeypatch):
    calls = len(recorded.batch_sizes)
    scores = mteb_scores(FlowcoreMTEBModel(recorded), stsb_task(stsb, monkeypatch))
    assert recorded.batch_sizes[calls:] == [ENCODE_KWARGS["batch_size"]] * 2  # mteb's batch size reaches the encoder
    (record,) = evaluate(recorded, datasets=["STS-B"], calibrations=["none"], data_dir=sts_data_dir,
                         show_progress_bar=False)
    mteb_spearman = 100 * scores["cosine_spearman"]
    assert record["n_pairs"] == len(stsb) == 1379
    assert mteb_spearman == pytest.approx(record["spearman"], abs=1e-6)
    # the model's similarity is cosine: MTEB's and the model's cosines round apart in the last bits on
    # some CPUs (3e-7 apart on an AVX-512 EPYC), which can swap near-tied ranks, so not bit for bit
    assert scores["main_score"] == scores["cosine_spearman"]
    assert scores["spearman"] == pytest.approx(scores["cosine_spearman"], abs=1e-6)
    assert mteb_spearman == pytest.approx(README_FIRST_LAST_AVG_STSB, abs=0.006)


@pytest.mark.filterwarnings("ignore:The task 'STSBenchmark' is superseded")
def test_mteb_sts_evaluator_equals_flowcore_sts_with_whitening(recorded, stsb, sts_data_dir, monkeypatch, tmp_path):
    corpus_file = tmp_path / "stsb-test-sentences.txt"
    corpus_file.write_text("\n".join(stsb.sentences()) + "\n", encoding="utf-8")
    (record,) = evaluate(recorded, datasets=["STS-B"], calibrations=["whitening"], data_dir=sts_data_dir,
                         fit_corpus=str(corpus_file), show_progress_bar=False)
    corpus = read_sentence_file(corpus_file)
    assert record["fit_sentences"] == len(corpus) == 2 * len(stsb)
    whitening = flowcore.Whitening().fit(recorded.encode(corpus))
    model = FlowcoreMTEBModel(recorded, whitening)
    scores = mteb_scores(model, stsb_task(stsb, monkeypatch))
    assert 100 * scores["cosine_spearman"] == pytest.approx(record["spearman"], abs=1e-6)
    assert scores["spearman"] == scores["cosine_spearman"]
    assert model.mteb_model_meta.embed_dim == whitening.output_dim


def test_protocol_and_model_meta(encoder, recorded, stsb):
    raw = FlowcoreMTEBModel(encoder)
    assert isinstance(raw, EncoderProtocol)
    meta = raw.mteb_model_meta
    assert isinstance(meta, ModelMeta) and meta is raw.mteb_model_meta
    assert meta.name == "flowcore/all-MiniLM-L6-v2-first-last-avg"
    assert meta.adapted_from == "sentence-transformers/all-MiniLM-L6-v2"
    assert meta.embed_dim == 384 and meta.max_tokens == encoder.max_length
    assert meta.similarity_fn_name is mteb.models.model_meta.ScoringFunction.COSINE
    assert meta.n_parameters == sum(p.numel() for p in encoder._loaded.model.parameters())
    assert meta.modalities == ["text"] and meta.use_instructions is False
    assert meta.languages == ["eng-Latn"] and meta.license == "apache-2.0"  # from mteb's registry, offline
    whitening = flowcore.Whitening(keep=128).fit(recorded.encode(stsb.sentences1[:400]))
    whitened = FlowcoreMTEBModel(encoder, whitening, normalize=True,
                                 meta_overrides={"training_datasets": {"STSBenchmark"}})
    assert whitened.mteb_model_meta.name.endswith("-whitening") and whitened.mteb_model_meta.embed_dim == 128
    assert whitened.mteb_model_meta.n_parameters == meta.n_parameters + 384 * 128 + 384
    assert whitened.mteb_model_meta.training_datasets == {"STSBenchmark"}
    revisions = {m.mteb_model_meta.revision for m in (raw, whitened, FlowcoreMTEBModel(encoder, whitening))}
    assert len(revisions) == 3  # calibration and normalisation each change the results folder
    assert FlowcoreMTEBModel(encoder).mteb_model_meta.revision == meta.revision  # and nothing else does
    with pytest.raises(ValueError, match="not fitted"):
        FlowcoreMTEBModel(encoder, flowcore.Whitening())
    with pytest.raises(ValueError, match="128-wide"):
        FlowcoreMTEBModel(encoder, flowcore.Whitening().fit(np.random.default_rng(0).normal(size=(50, 128))))
    with pytest.raises(TypeError, match="transform"):
        FlowcoreMTEBModel(encoder, calibrator=object())


def test_encode_over_mteb_batches(recorded, stsb):
    texts = stsb.sentences1[:10]
    X = recorded.encode(texts)
    whitening = flowcore.Whitening(keep=64).fit(recorded.encode(stsb.sentences()[:600]))
    model = FlowcoreMTEBModel(recorded, whitening)
    got = model.encode(loader(texts, batch_size=3), task_metadata=None, hf_split="test", hf_subset="default",
                       prompt_type=mteb.types.PromptType.query, batch_size=3)
    assert got.dtype == np.float64 and got.shape == (10, 64)  # float32 vectors, upcast exactly for mteb's scores
    np.testing.assert_array_equal(got, whitening.transform(X))  # every row, in input order
    single = FlowcoreMTEBModel(recorded, whitening, dtype="float32").encode(loader(texts), task_metadata=None,
                                                                           hf_split="test", hf_subset="default")
    assert single.dtype == np.float32
    np.testing.assert_array_equal(single, got)
    unit = FlowcoreMTEBModel(recorded, whitening, normalize=True).encode(loader(texts), task_metadata=None,
                                                                        hf_split="test", hf_subset="default")
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1, atol=1e-6)
    pairwise = np.asarray(model.similarity_pairwise(got[:5], got[5:]))
    np.testing.assert_allclose(pairwise, cosine_similarity(got[:5], got[5:]), atol=1e-6)
    matrix = np.asarray(model.similarity(got[:4], got))
    assert matrix.shape == (4, 10)
    np.testing.assert_allclose(np.diag(matrix[:, :4]), 1, atol=1e-6)
    empty = model.encode([], task_metadata=None, hf_split="test", hf_subset="default")
    assert empty.shape == (0, 64)
    with pytest.raises(ValueError, match="text only"):
        model.encode([{"image": [0]}], task_metadata=None, hf_split="test", hf_subset="default")


def test_from_calibrator_file(recorded, encoder, stsb, tmp_path):
    sentences = stsb.sentences()[:512]
    calibrator = flowcore.FlowCalibrator(config="l2_d2_w32").fit(recorded.encode(sentences), encoder=encoder,
                                                                 show_progress_bar=False)
    path = tmp_path / "stsb.flow"
    calibrator.save(path)
    model = FlowcoreMTEBModel.from_calibrator_file(path, encoder=recorded)
    texts = stsb.sentences2[:7]
    got = model.encode(loader(texts), task_metadata=None, hf_split="test", hf_subset="default")
    np.testing.assert_allclose(got, calibrator.transform(recorded.encode(texts)), rtol=0, atol=1e-5)
    own = FlowcoreMTEBModel.from_calibrator_file(path)  # the encoder the file records: default, first-last-avg
    assert (own.encoder.model_id, own.encoder.pooling) == ("default", "first-last-avg")
    assert own.mteb_model_meta.name == "flowcore/all-MiniLM-L6-v2-first-last-avg-flow"
    assert own.mteb_model_meta.revision.startswith(file_sha256(path)[:12])
    with pytest.raises(ValueError, match="pooling"):
        FlowcoreMTEBModel.from_calibrator_file(path, encoder=flowcore.Encoder(pooling="mean"))
    anonymous = tmp_path / "raw.flow"
    flowcore.FlowCalibrator(config="l2_d2_w32").fit(recorded.encode(sentences), show_progress_bar=False).save(anonymous)
    with pytest.raises(ValueError, match="records no encoder"):
        FlowcoreMTEBModel.from_calibrator_file(anonymous)
    assert FlowcoreMTEBModel.from_calibrator_file(anonymous, encoder=recorded).embed_dim == 384


def test_importing_the_adapter_does_not_import_mteb():
    code = "import sys, flowcore.integrations.mteb; assert 'mteb' not in sys.modules, 'mteb was imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("name, settings", [("abtt", {"k": 2}), ("whitening", {"power": 0.25, "keep": 96}),
                                            ("zca", {}), ("center", {}), ("none", {})])
def test_any_calibrator_file_and_its_name(recorded, encoder, stsb, tmp_path, name, settings):
    """The adapter reads every calibrator through the protocol: its file, name, widths and encoder."""
    calibrator = flowcore.calibration.create(name, **settings).fit(recorded.encode(stsb.sentences()[:600]),
                                                                   encoder=encoder)
    calibrator.save(tmp_path / f"{name}.flow")
    model = FlowcoreMTEBModel.from_calibrator_file(tmp_path / f"{name}.flow", encoder=recorded)
    assert model.calibration == name and model.embed_dim == calibrator.output_dim
    assert model.mteb_model_meta.name == f"flowcore/all-MiniLM-L6-v2-first-last-avg-{name}"
    texts = stsb.sentences2[:5]
    np.testing.assert_array_equal(model.encode(loader(texts), task_metadata=None, hf_split="test",
                                               hf_subset="default"), calibrator.transform(recorded.encode(texts)))
    fingerprint = FlowcoreMTEBModel(recorded, calibrator).mteb_model_meta.revision
    assert FlowcoreMTEBModel(recorded, flowcore.load(tmp_path / f"{name}.flow")).mteb_model_meta.revision == \
        fingerprint  # loaded or fitted here: the same state, the same results folder
    with pytest.raises(ValueError, match="pooling"):
        FlowcoreMTEBModel(flowcore.Encoder(pooling="mean"), calibrator)
