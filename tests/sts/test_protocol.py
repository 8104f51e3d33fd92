"""The STS evaluation protocol with stand-in encoders and calibrators, and MTEB parity and the
flow's lift with the real default encoder."""
import logging

import numpy as np
import pytest

from flowcore.calibration.corpus_size import small_corpus_warning
from flowcore.sts.baselines import Baseline, CalibrationSettings, PreFitted
from flowcore.sts.data import load_split
from flowcore.sts.pairs import load_pairs
from flowcore.sts.protocol import evaluate
from flowcore.sts.report import markdown_table
from flowcore.text.cache import EmbeddingCache

from helpers.sts_stand_ins import HashEncoder, MeanShift


@pytest.fixture
def stand_in(monkeypatch):
    """`stand_in(name, cls)`: calibration `name` is built as `cls()` (a fast stand-in) instead of the real one."""
    from flowcore.sts import protocol

    built_in, stand_ins = protocol.build_calibrator, {}
    monkeypatch.setattr(protocol, "build_calibrator",
                        lambda name, *args: Baseline(stand_ins[name]()) if name in stand_ins else built_in(name, *args))
    return stand_ins.__setitem__


def test_evaluate_protocol_with_stand_ins(sts_data_dir, tmp_path, stand_in):
    encoder = HashEncoder()
    MeanShift.fitted_rows = []
    stand_in("flow", MeanShift)
    records = evaluate(encoder, datasets=["STS16", "STS-B"], calibrations=["none", "whitening", "flow"],
                       data_dir=sts_data_dir, cache=EmbeddingCache(tmp_path),
                       settings=CalibrationSettings(whitening_dim=8), show_progress_bar=False)
    assert [(r["dataset"], r["calibration"]) for r in records] == [
        (d, c) for d in ("STS16", "STS-B") for c in ("none", "whitening", "flow")]
    assert MeanShift.fitted_rows == [2 * 1186, 2 * 8628]  # target: every sentence of every split
    by_key = {(r["dataset"], r["calibration"]): r for r in records}
    assert by_key["STS-B", "none"]["n_pairs"] == 1379 and "fit_corpus" not in by_key["STS-B", "none"]
    assert by_key["STS-B", "whitening"]["whitening_dim"] == 8
    assert by_key["STS16", "flow"]["fit_corpus"] == "target" and by_key["STS16", "flow"]["fit_sentences"] == 2372
    assert set(by_key["STS16", "none"]["subsets"]) == {"answer-answer", "headlines", "plagiarism", "postediting",
                                                       "question-question"}
    for record in records:  # random vectors carry no meaning: every correlation is near zero
        assert abs(record["spearman"]) < 10 and record["model"] == "hash-encoder"
    encoded = len(encoder.encoded)
    evaluate(encoder, datasets=["STS-B"], calibrations=["whitening"], data_dir=sts_data_dir,
             cache=EmbeddingCache(tmp_path), show_progress_bar=False)
    assert len(encoder.encoded) == encoded  # a second run re-encodes nothing


def test_calibration_fitted_on_a_sentence_file_is_fitted_once(sts_data_dir, tmp_path, stand_in):
    corpus = tmp_path / "nli.txt"
    corpus.write_text("A man sleeps.\nA dog runs.\nTwo birds sing.\n", encoding="utf-8")
    MeanShift.fitted_rows = []
    stand_in("flow", MeanShift)
    records = evaluate(HashEncoder(), datasets=["STS13", "STS16"], calibrations=["flow"], data_dir=sts_data_dir,
                       fit_corpus=str(corpus), show_progress_bar=False)
    assert MeanShift.fitted_rows == [3]
    assert {r["fit_corpus"] for r in records} == {str(corpus)}


def test_failed_calibration_is_reported_and_kept(sts_data_dir, stand_in):
    class Exploding(MeanShift):
        def transform(self, X):
            return np.full_like(X, np.nan)

    stand_in("flow", Exploding)
    records = evaluate(HashEncoder(), datasets=["STS16"], calibrations=["none", "flow"], data_dir=sts_data_dir,
                       show_progress_bar=False)
    assert records[0]["spearman"] is not None
    assert records[1]["spearman"] is None and "NaN" in records[1]["error"]
    assert "| n/a |" in markdown_table(records)


def test_progress_is_logged_and_failures_are_warnings(sts_data_dir, caplog, stand_in):
    class Exploding(MeanShift):
        def transform(self, X):
            return np.full_like(X, np.nan)

    stand_in("flow", Exploding)
    with caplog.at_level(logging.INFO, logger="flowcore.sts"):
        evaluate(HashEncoder(), datasets=["STS16"], calibrations=["none", "flow"], data_dir=sts_data_dir,
                 show_progress_bar=True)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines[0] == ("INFO", "STS16: 1186 test pairs")
    assert ("INFO", "STS16: fitting flow on 2372 target sentences") in lines
    assert lines[-1] == ("WARNING", "STS16: flow failed: the calibrated vectors contain NaN or Inf")
    assert any(level == "INFO" and text.startswith("STS16: none: Spearman ") for level, text in lines)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="flowcore.sts"):
        evaluate(HashEncoder(), datasets=["STS16"], calibrations=["none", "flow"], data_dir=sts_data_dir,
                 show_progress_bar=False)
    # show_progress_bar=False: failures only
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [lines[-1]]


def _write_stsb_tsv(data_dir, path):
    pairs = load_split(data_dir, "STS-B", "test")
    lines = ["sentence1\tsentence2\tscore"] + [f"{a}\t{b}\t{s!r}" for a, b, s in
                                                zip(pairs.sentences1, pairs.sentences2, pairs.scores.tolist())]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_pairs_of_a_file_match_the_built_in_dataset(sts_data_dir, tmp_path):
    """STS-B's test set written as a .tsv scores exactly as the built-in STS-B row."""
    pairs = load_pairs(_write_stsb_tsv(sts_data_dir, tmp_path / "stsb.tsv"))
    encoder = HashEncoder()
    built_in, = evaluate(encoder, datasets=["STS-B"], data_dir=sts_data_dir, show_progress_bar=False)
    own, = evaluate(encoder, pairs=[pairs], data_dir=tmp_path / "not-read", show_progress_bar=False)
    assert own["spearman"] == built_in["spearman"] and own["pearson"] == built_in["pearson"]
    assert own["n_pairs"] == 1379 and own["dataset"] == "stsb" and own["split"] == "pairs"
    assert own["pairs_file"] == str(tmp_path / "stsb.tsv") and own["skipped_lines"] == 0
    assert "| encoder + calibration | stsb | Avg. |" in markdown_table([own])


def test_pairs_fit_on_their_own_sentences_and_small_corpora_warn(tmp_path, caplog, stand_in):
    path = tmp_path / "mine.tsv"
    rows = [f"sentence {i}\tother {i % 7}\t{i % 5}" for i in range(30)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    MeanShift.fitted_rows = []
    stand_in("flow", MeanShift)
    with caplog.at_level(logging.WARNING, logger="flowcore.sts"):
        none, flow = evaluate(HashEncoder(), pairs=[load_pairs(path)], calibrations=["none", "flow"],
                              show_progress_bar=False)
    assert MeanShift.fitted_rows == [60]  # both sides of every pair, with repeats
    expected = small_corpus_warning(37, 16)  # 30 + 7 distinct sentences < 5 x 16
    assert flow["fit_corpus"] == "target" and flow["fit_sentences"] == 60 and flow["fit_distinct_sentences"] == 37
    assert flow["warning"] == expected and "warning" not in none
    assert caplog.messages == [f"mine: {expected}"]
    with pytest.raises(ValueError, match="needs the built-in datasets"):
        evaluate(HashEncoder(), pairs=[load_pairs(path)], calibrations=["flow"], fit_corpus="train",
                 show_progress_bar=False)


def test_a_small_file_corpus_warns_once_and_is_recorded_everywhere(tmp_path, caplog, stand_in):
    files = []
    for name in ("first", "second"):
        files.append(tmp_path / f"{name}.tsv")
        files[-1].write_text("".join(f"{name} {i}\tother {i}\t{i % 5}\n" for i in range(10)), encoding="utf-8")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"fit sentence {i}\n" for i in range(12)), encoding="utf-8")
    MeanShift.fitted_rows = []
    stand_in("flow", MeanShift)
    with caplog.at_level(logging.WARNING, logger="flowcore.sts"):
        records = evaluate(HashEncoder(), pairs=[load_pairs(f) for f in files], calibrations=["none", "flow"],
                           fit_corpus=str(corpus), show_progress_bar=False)
    expected = small_corpus_warning(12, 16)
    assert MeanShift.fitted_rows == [12]  # fitted once, reused for both files
    assert [r.get("warning") for r in records] == [None, expected, None, expected]
    assert caplog.messages == [f"{corpus}: {expected}"]


def test_no_warning_on_a_large_enough_corpus(sts_data_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="flowcore.sts"):
        record, = evaluate(HashEncoder(), datasets=["STS16"], calibrations=["whitening"], data_dir=sts_data_dir,
                           show_progress_bar=False)
    assert "warning" not in record and record["fit_distinct_sentences"] >= 5 * 16 and caplog.messages == []


def test_a_prefitted_calibrator_is_applied_as_it_is(sts_data_dir, tmp_path):
    shift = MeanShift().fit(np.zeros((2, 16), dtype=np.float32))
    MeanShift.fitted_rows = []
    record, = evaluate(HashEncoder(), datasets=["STS16"], calibrations=["flow"], data_dir=sts_data_dir,
                       fitted={"flow": PreFitted(shift, "my.flow", {"flow_config": "x"})}, show_progress_bar=False)
    assert MeanShift.fitted_rows == [] and record["fit_corpus"] == "my.flow" and record["flow_config"] == "x"
    assert "fit_sentences" not in record and "warning" not in record
    assert "| hash-encoder mean + flow (my.flow) |" in markdown_table([record])


@pytest.fixture(scope="module")
def encode_cache(tmp_path_factory):
    """One embedding cache for the real-encoder tests of this module (each sentence encoded once)."""
    return EmbeddingCache(tmp_path_factory.mktemp("embeddings"))


@pytest.mark.parametrize("dataset, mteb", [("STS-B", 82.03), ("STS16", 78.99)])
def test_mteb_parity_of_the_raw_default_encoder(sts_data_dir, encode_cache, dataset, mteb):
    """Exact parity with MTEB's published all-MiniLM-L6-v2 figures (mean pooling, `all` aggregation)."""
    from flowcore.text.encoder import Encoder

    record, = evaluate(Encoder("default", pooling="mean"), datasets=[dataset], calibrations=["none"],
                       data_dir=sts_data_dir, cache=encode_cache, show_progress_bar=False)
    assert record["spearman"] == pytest.approx(mteb, abs=0.05)


def test_flow_lifts_an_anisotropic_pooling_as_much_as_whitening(sts_data_dir, encode_cache):
    """static-avg (averaged word embeddings) of the default model is anisotropic: raw 61.2 on STS16."""
    from flowcore.text.encoder import Encoder

    none, whitening, flow = evaluate(Encoder("default", pooling="static-avg"), datasets=["STS16"],
                                     calibrations=["none", "whitening", "flow"], data_dir=sts_data_dir,
                                     cache=encode_cache, show_progress_bar=False)
    assert flow["spearman"] > none["spearman"] + 8
    assert flow["spearman"] >= whitening["spearman"] - 0.3  # the default recipe never ends below whitening
    assert np.isfinite(flow["flow_losses"]).all()
    heldout = flow["flow_heldout_bits_per_dim"]  # the whitening start, then each epoch trained
    assert np.isfinite(heldout).all() and 2 <= len(heldout) <= 4
    assert heldout[flow["flow_selected_epoch"]] == min(heldout)


def test_flow_defaults_survive_constant_coordinates_of_mean_pooling(sts_data_dir, encode_cache):
    """Mean-pooled MiniLM has two coordinates constant to 1e-32: fed raw, the engine's defaults
    diverge; `flowcore sts` standardizes and drops them, and the flow then trains normally."""
    from flowcore.text.encoder import Encoder

    encoder = Encoder("default", pooling="mean")
    flow, = evaluate(encoder, datasets=["STS16"], calibrations=["flow"], data_dir=sts_data_dir,
                     cache=encode_cache, show_progress_bar=False)
    assert "error" not in flow and flow["spearman"] > 70 and flow["flow_losses"][0] < 5
    raw, = evaluate(encoder, datasets=["STS16"], calibrations=["flow"], data_dir=sts_data_dir,
                    cache=encode_cache, settings=CalibrationSettings(flow_input="raw"), show_progress_bar=False)
    assert "non-finite" in raw.get("error", "") or raw["flow_losses"][0] > 1000  # diverged, or blew up


_UNPATCHED_SCORE_ONE = None


def _score_one_with_pid(index):
    import os

    return [dict(record, pid=os.getpid()) for record in _UNPATCHED_SCORE_ONE(index)]


def test_datasets_fit_their_flows_side_by_side_with_the_same_records(sts_data_dir, tmp_path, monkeypatch):
    """jobs=2 fits the datasets' flows in forked worker processes: the records, flow losses
    included, equal those of one process bit for bit, in the datasets' order."""
    import os

    from flowcore.sts import protocol

    global _UNPATCHED_SCORE_ONE
    kwargs = dict(datasets=["STS16", "STS13"], calibrations=["none", "whitening", "flow"], data_dir=sts_data_dir,
                  cache=EmbeddingCache(tmp_path), settings=CalibrationSettings(flow_config="l2_d2_w32", flow_epochs=1),
                  show_progress_bar=False)
    alone = evaluate(HashEncoder(dim=24), jobs=1, **kwargs)
    _UNPATCHED_SCORE_ONE = protocol._score_one
    monkeypatch.setattr(protocol, "_score_one", _score_one_with_pid)
    side_by_side = evaluate(HashEncoder(dim=24), jobs=2, **kwargs)
    assert {record.pop("pid") for record in side_by_side} - {os.getpid()}  # ran in other processes
    assert [(r["dataset"], r["calibration"]) for r in side_by_side] == [(r["dataset"], r["calibration"]) for r in alone]
    assert alone[2]["flow_losses"]
    for ours, theirs in zip(side_by_side, alone):
        ours.pop("seconds"), theirs.pop("seconds")
        assert ours == theirs


def _worker_signal_handlers(index):
    import signal

    return [{"index": index, "sigterm": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
             "sigint": signal.getsignal(signal.SIGINT) == signal.SIG_IGN}]


def test_forked_workers_end_on_the_pools_terminate_whatever_the_parents_signal_handlers(monkeypatch):
    """A process running Ray has Ray's SIGTERM handler, which a forked worker inherited: the pool's
    terminate() then ran it in the worker (draining Ray's node over a connection the fork cannot
    use) and waited for the worker forever. Workers take the default SIGTERM and leave Ctrl-C to
    the parent."""
    import dataclasses
    import os
    import signal
    from types import SimpleNamespace

    from flowcore.sts import protocol

    @dataclasses.dataclass
    class Scorer:
        bars: bool = True

    monkeypatch.setattr(protocol, "_score_one", _worker_signal_handlers)
    # the parent's own handler (one that exits, so that without the reset this fails instead of hanging)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(3))
    try:
        records = protocol._score_in_processes(Scorer(), [SimpleNamespace(corpus_vectors=[0] * n) for n in (1, 3)], 2)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert records == [{"index": 0, "sigterm": True, "sigint": True}, {"index": 1, "sigterm": True, "sigint": True}]


def test_flows_are_fitted_side_by_side_only_where_that_is_safe_and_the_same(sts_data_dir, tmp_path, monkeypatch):
    """One process for: nothing that trains, a file corpus, CUDA, or batches that would train on several threads
    (their results depend on the thread count); processes for a flow that trains on one thread."""
    from flowcore.runtime import training_threads
    from flowcore.sts import protocol

    calls = []
    monkeypatch.setattr(protocol, "_score_in_processes", lambda *args: calls.append(args) or [])
    class TrainsOnOneThread(MeanShift):  # a stand-in flow: what decides is that its fit trains on one thread
        def fit_threads(self):
            return 1

    built_in = protocol.build_calibrator
    stand_in = lambda name, *args: Baseline(TrainsOnOneThread()) if name == "flow" else built_in(name, *args)  # noqa

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("A man sleeps.\nA dog runs.\n", encoding="utf-8")
    base = dict(datasets=["STS16", "STS13"], data_dir=sts_data_dir, cache=EmbeddingCache(tmp_path),
                show_progress_bar=False,
                jobs=2)
    serial = [dict(calibrations=["none", "whitening"]),
              dict(calibrations=["flow"], fit_corpus=str(corpus)),
              dict(calibrations=["flow"], settings=CalibrationSettings(device="cuda")),
              dict(calibrations=["flow"], jobs=1)]
    for options in serial:
        calls.clear()
        with monkeypatch.context() as patch:  # nothing is fitted for real: a stand-in flow
            patch.setattr(protocol, "build_calibrator", stand_in)
            evaluate(HashEncoder(), **{**base, **options})
        assert not calls, options
    evaluate(HashEncoder(), calibrations=["flow"], **base)
    assert len(calls) == 1 and calls[0][2] == 2
    calls.clear()
    wide = CalibrationSettings(flow_batch_size=4096)  # the real flow's threads decide (nothing is fitted here)
    evaluate(HashEncoder(), calibrations=["flow"], settings=wide, **base)
    assert bool(calls) == (training_threads(4096) == 1)


def test_jobs_must_be_positive(sts_data_dir):
    with pytest.raises(ValueError, match="jobs must be at least 1, got 0"):
        evaluate(HashEncoder(), datasets=["STS16"], data_dir=sts_data_dir, jobs=0)
