"""flowcore.Encoder: every pooling against an independent transformers computation, `mean`
against sentence-transformers, and batching, caching, SDPA attention and errors on a tiny random
BERT. The CUDA path is tests/text/test_encoder_cuda.py."""
import os
import re
import warnings

import numpy as np
import pytest
import torch

from flowcore.runtime import available_cpus
from flowcore.text.encoder import Encoder, default_model_path

from helpers.tiny_models import WORDS


def _sts_sentences(sts_data_dir, count):
    """The first `count` distinct sentences of the STS-B test file (tab-separated, no quoting)."""
    sentences = []
    with open(sts_data_dir / "STSBenchmark" / "sts-test.csv", encoding="utf-8") as lines:
        for line in lines:
            columns = line.rstrip("\n").split("\t")
            for sentence in columns[5:7]:
                if sentence not in sentences:
                    sentences.append(sentence)
            if len(sentences) >= count:
                return sentences[:count]
    return sentences


def _cosines(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _random_sentences(count, seed=0, max_words=40):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=rng.integers(0, max_words))) for _ in range(count)]


# ---- the default model against independent computations -------------------------------------------

@pytest.fixture(scope="module")
def real_sentences(sts_data_dir):
    return _sts_sentences(sts_data_dir, 24) + ["", "   ", "Short."]


@pytest.fixture(scope="module")
def reference_hidden_states(real_sentences):
    """hidden_states of all-MiniLM-L6-v2 straight from transformers, with the padded attention mask."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    model = AutoModel.from_pretrained(default_model_path()).eval()
    batch = tokenizer(real_sentences, padding=True, truncation=True, max_length=512, return_tensors="pt")
    with torch.no_grad():
        output = model(**batch, output_hidden_states=True)
    return [state.double() for state in output.hidden_states], batch["attention_mask"].double()


def _plain_masked_mean(state, mask):
    return (state * mask[:, :, None]).sum(1) / mask.sum(1, keepdim=True)


@pytest.mark.parametrize("pooling, expected", [
    ("cls", lambda hs, mask: hs[-1][:, 0]),
    ("mean", lambda hs, mask: _plain_masked_mean(hs[-1], mask)),
    ("last2-avg", lambda hs, mask: (_plain_masked_mean(hs[-2], mask) + _plain_masked_mean(hs[-1], mask)) / 2),
    ("first-last-avg", lambda hs, mask: (_plain_masked_mean(hs[1], mask) + _plain_masked_mean(hs[-1], mask)) / 2),
    ("static-avg", lambda hs, mask: _plain_masked_mean(hs[0], mask)),
    ("layers=2,4,5", lambda hs, mask: sum(_plain_masked_mean(hs[i], mask) for i in (2, 4, 5)) / 3),
])
def test_every_pooling_matches_transformers(pooling, expected, real_sentences, reference_hidden_states):
    hidden_states, mask = reference_hidden_states
    want = expected(hidden_states, mask).numpy()
    got = Encoder(pooling=pooling).encode(real_sentences, batch_size=5)
    assert got.shape == (len(real_sentences), 384) and got.dtype == np.float32
    assert _cosines(got, want).min() > 0.99999
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_mean_matches_sentence_transformers(real_sentences):
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(default_model_path(), device="cpu").encode(real_sentences, batch_size=7)
    got = Encoder(pooling="mean").encode(real_sentences, normalize=True)
    assert _cosines(got, reference).min() > 0.99999
    np.testing.assert_allclose(got, reference, atol=1e-5)


def test_default_encoder_attributes():
    encoder = Encoder()  # the default model is a sentence-transformers folder declaring mean pooling
    assert (encoder.model_id, encoder.pooling, encoder.dim) == ("default", "mean", 384)
    assert Encoder(layers=[-1, 1]).pooling == "layers=1,6"
    assert Encoder(pooling="layers=6,1").pooling == "layers=1,6"
    assert Encoder(pooling="mean")._loaded is encoder._loaded  # a second Encoder reuses the loaded weights


def test_the_default_pooling_is_the_models_own_else_first_last_avg(tiny_bert, tmp_path):
    """A sentence-transformers folder's Pooling module (mean or cls) is the default; a plain folder, or a mode
    flowcore does not offer (max), gives first-last-avg."""
    import json
    import shutil

    assert Encoder(tiny_bert).pooling == "first-last-avg"
    for mode, expected in (("pooling_mode_cls_token", "cls"), ("pooling_mode_max_tokens", "first-last-avg")):
        folder = tmp_path / mode
        shutil.copytree(tiny_bert, folder)
        (folder / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
        (folder / "1_Pooling").mkdir()
        (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": False, mode: True}))
        assert Encoder(str(folder)).pooling == expected


def test_a_calibrator_fitted_on_encoded_vectors_records_the_encoder(tiny_bert, tmp_path):
    """The Python quick start: vectors from `Encoder.encode` (or a view of them) carry their encoder into a fit,
    so the saved file calibrates text without --model/--pooling; a copy, a conversion or normalised vectors do
    not (their encoder is unknown), and a file fitted on them says so where an encoder is needed."""
    import flowcore
    from flowcore.batch.job import calibrate_file
    from flowcore.calibration.file import EncoderProvenance

    encoder = Encoder(tiny_bert, pooling="mean")
    sentences = [" ".join(WORDS[i:i + 4]) for i in range(len(WORDS) - 4)] * 3
    X = encoder.encode(sentences)
    recorded = EncoderProvenance(encoder.model_id, "mean")
    assert flowcore.Whitening().fit(X).provenance == recorded
    assert flowcore.MeanCentering().fit(X[: len(X) // 2]).provenance == recorded
    assert flowcore.AutoCalibration().fit(X).provenance == recorded
    for unknown in (X.astype(np.float64), X.copy(), encoder.encode(sentences, normalize=True)):
        assert flowcore.Whitening().fit(unknown).provenance is None
    flowcore.Whitening().fit(X).save(tmp_path / "calibrator.flow")
    (tmp_path / "corpus.txt").write_text("the cat sat\na dog ran\n")
    summary = calibrate_file(tmp_path / "calibrator.flow", tmp_path / "out.npy", input=tmp_path / "corpus.txt",
                             show_progress_bar=False)
    assert summary.rows == 2 and not summary.rejects
    flowcore.Whitening().fit(X.copy()).save(tmp_path / "foreign.flow")
    with pytest.raises(ValueError, match="it was fitted on vectors that did not come from a flowcore Encoder"):
        calibrate_file(tmp_path / "foreign.flow", tmp_path / "out2.npy", input=tmp_path / "corpus.txt",
                       show_progress_bar=False)


@pytest.mark.parametrize("architecture", ["roberta", "mpnet", "distilbert"])
def test_other_architectures_match_transformers(architecture, tiny_bert, tmp_path):
    """The layer stack is found and hidden states are caught the same way in other encoders."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    config = AutoConfig.for_model(architecture, vocab_size=len(WORDS) + 5, pad_token_id=0, max_position_embeddings=80,
                                  **({"dim": 16, "n_layers": 3, "n_heads": 2, "hidden_dim": 32}
                                     if architecture == "distilbert" else
                                     {"hidden_size": 16, "num_hidden_layers": 3, "num_attention_heads": 2,
                                      "intermediate_size": 32}))
    AutoModel.from_config(config).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(tmp_path)
    sentences = _random_sentences(12, seed=4)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    batch = tokenizer(sentences, padding=True, return_tensors="pt", return_token_type_ids=False)
    with torch.no_grad():
        hidden_states = [state.double() for state in AutoModel.from_pretrained(tmp_path).eval()(
            **batch, output_hidden_states=True).hidden_states]
    mask = batch["attention_mask"].double()
    for pooling, want in [("static-avg", _plain_masked_mean(hidden_states[0], mask)),
                          ("layers=1", _plain_masked_mean(hidden_states[1], mask)),
                          ("first-last-avg", (_plain_masked_mean(hidden_states[1], mask)
                                              + _plain_masked_mean(hidden_states[3], mask)) / 2),
                          ("cls", hidden_states[3][:, 0])]:
        got = Encoder(str(tmp_path), pooling=pooling).encode(sentences, batch_size=5)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5, err_msg=pooling)
    loaded = Encoder(str(tmp_path))._loaded  # SDPA where the class has it (MPNet does not: eager)
    assert loaded.attention == ("sdpa" if type(loaded.model)._supports_sdpa else "eager")


# ---- batching, caching and stopping early (tiny BERT) -----------------------------------------------

def test_order_is_kept_when_batches_are_length_sorted(tiny_bert):
    encoder = Encoder(tiny_bert, pooling="mean")
    sentences = _random_sentences(60, seed=1)
    assert len({len(s.split()) for s in sentences}) > 20  # shuffled lengths, so sorting reorders
    together = encoder.encode(sentences, batch_size=7, max_tokens=100)
    one_by_one = np.concatenate([encoder.encode([sentence]) for sentence in sentences])
    np.testing.assert_allclose(together, one_by_one, rtol=1e-5, atol=1e-6)


def _batch_differences(encoder, sentences, others):
    """(largest |difference|, largest difference / row norm, smallest cosine) between each
    sentence encoded alone and the same sentence encoded in batches of other sizes, shuffled
    among `others` (other lengths, so other padded widths), or beside the longest text."""
    rng = np.random.default_rng(0)
    alone = np.concatenate([encoder.encode([sentence]) for sentence in sentences])
    runs = [encoder.encode(sentences, batch_size=size) for size in (3, 16, 64)]
    for batch_size in (8, 32):
        order = rng.permutation(len(sentences))
        mixed = encoder.encode([sentences[i] for i in order] + others, batch_size=batch_size)[:len(sentences)]
        runs.append(mixed[np.argsort(order)])
    longest = max(sentences + others, key=len)
    runs.append(np.concatenate([encoder.encode([sentence, longest])[:1] for sentence in sentences]))
    worst_abs = max(float(np.abs(run - alone).max()) for run in runs)
    worst_rel = max(float((np.linalg.norm(run - alone, axis=1) / np.linalg.norm(alone, axis=1)).max()) for run in runs)
    return worst_abs, worst_rel, min(float(_cosines(run, alone).min()) for run in runs)


def test_a_sentence_gets_the_same_vector_in_any_batch_to_the_documented_tolerance(tiny_bert):
    """Encoder.encode's docstring: measured <= 4e-7 on this tiny BERT; checked with a 5x margin."""
    sentences = _random_sentences(60, seed=6)
    for pooling in ("mean", "first-last-avg", "cls"):
        worst_abs, worst_rel, worst_cos = _batch_differences(Encoder(tiny_bert, pooling=pooling), sentences,
                                                             _random_sentences(20, seed=7))
        assert worst_abs <= 2e-6 and worst_rel <= 1e-6 and worst_cos > 1 - 1e-10, (pooling, worst_abs, worst_rel)


def test_the_default_model_gives_the_same_vector_in_any_batch_to_the_documented_tolerance(sts_data_dir):
    """all-MiniLM-L6-v2 on STS-B sentences: measured max |difference| <= 1.5e-6 (cls; <= 4e-7 for
    first-last-avg), <= 7e-7 of the row's norm, cosine > 1 - 1e-12 (docstring); checked with margin."""
    sentences = _sts_sentences(sts_data_dir, 60)
    for pooling in ("first-last-avg", "cls"):
        worst_abs, worst_rel, worst_cos = _batch_differences(Encoder(pooling=pooling), sentences[:40], sentences[40:])
        assert worst_abs <= 5e-6 and worst_rel <= 3e-6 and worst_cos > 1 - 1e-10, (pooling, worst_abs, worst_rel)


def test_batches_respect_sentence_count_and_token_budget(tiny_bert):
    encoder = Encoder(tiny_bert, pooling="mean")
    shapes = []
    hook = encoder._loaded.model.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        encoder.encode(_random_sentences(80, seed=2), batch_size=16, max_tokens=200)
    finally:
        hook.remove()
    assert sum(rows for rows, _ in shapes) == len(set(_random_sentences(80, seed=2)))
    assert all(rows <= 16 and (rows * width <= 200 or rows == 1) for rows, width in shapes)
    assert [width for _, width in shapes] == sorted((width for _, width in shapes), reverse=True)


def test_identical_sentences_are_encoded_once(tiny_bert):
    encoder = Encoder(tiny_bert, pooling="mean")
    sentences = ["the cat sat", "a dog ran", "the cat sat", "", "a dog ran", "the cat sat", ""]
    encoded_rows = []
    hook = encoder._loaded.model.register_forward_pre_hook(
        lambda module, args, kwargs: encoded_rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    try:
        vectors = encoder.encode(sentences)
    finally:
        hook.remove()
    assert sum(encoded_rows) == 3
    np.testing.assert_array_equal(vectors[0], vectors[2])
    np.testing.assert_array_equal(vectors[1], vectors[4])
    assert not np.allclose(vectors[0], vectors[1])


@pytest.mark.parametrize("pooling, layers_run", [("static-avg", 0), ("layers=1", 1), ("first-last-avg", 3)])
def test_forward_stops_after_the_deepest_needed_layer(tiny_bert, pooling, layers_run):
    encoder = Encoder(tiny_bert, pooling=pooling)
    ran = []
    hooks = [layer.register_forward_hook(lambda module, args, output, i=i: ran.append(i))
             for i, layer in enumerate(encoder._loaded.model.encoder.layer)]
    try:
        encoder.encode(["the cat sat on the mat", "a dog"])
    finally:
        for hook in hooks:
            hook.remove()
    assert ran == list(range(layers_run))


def test_encoders_sharing_a_model_encode_concurrently(tiny_bert):
    from concurrent.futures import ThreadPoolExecutor

    encoders = [Encoder(tiny_bert, pooling="static-avg"), Encoder(tiny_bert, pooling="mean")]
    assert encoders[0]._loaded is encoders[1]._loaded
    sentences = _random_sentences(40, seed=3)
    alone = [encoder.encode(sentences, batch_size=2) for encoder in encoders]
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(lambda encoder: encoder.encode(sentences, batch_size=2), encoders * 3))
    for index, vectors in enumerate(together):
        np.testing.assert_allclose(vectors, alone[index % 2], rtol=1e-5, atol=1e-6)


def test_pooler_head_is_not_run(tiny_bert):
    assert Encoder(tiny_bert)._loaded.model.pooler is None


# ---- attention: SDPA where the model class has it ------------------------------------------------

def _count_sdpa_calls(monkeypatch) -> list:
    """A list that grows by one at each call of torch's scaled_dot_product_attention."""
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    return calls


def test_the_model_runs_sdpa_attention_and_matches_eager_attention(tiny_bert, tmp_path, monkeypatch):
    """Loaded with SDPA (recorded by describe()); the same encodes with the model switched to
    eager attention give the same vectors to float32 rounding, padded batches included."""
    import shutil

    folder = str(shutil.copytree(tiny_bert, tmp_path / "bert"))  # its own loaded model: switched to eager below
    encoders = [Encoder(folder, pooling=pooling) for pooling in ("mean", "cls", "first-last-avg")]
    assert encoders[0]._loaded.attention == "sdpa" and encoders[0]._loaded.model.config._attn_implementation == "sdpa"
    assert all(encoder.describe()["attention"] == "sdpa" for encoder in encoders)
    sentences = _random_sentences(40, seed=8)
    calls = _count_sdpa_calls(monkeypatch)
    with_sdpa = [encoder.encode(sentences, batch_size=8) for encoder in encoders]
    assert calls, "the sdpa model did not call scaled_dot_product_attention"
    encoders[0]._loaded.model.set_attn_implementation("eager")
    calls.clear()
    with_eager = [encoder.encode(sentences, batch_size=8) for encoder in encoders]
    assert not calls and encoders[0].describe()["attention"] == "eager"
    for encoder, sdpa, eager in zip(encoders, with_sdpa, with_eager):
        np.testing.assert_allclose(sdpa, eager, rtol=1e-5, atol=2e-6, err_msg=encoder.pooling)


def test_a_model_class_without_sdpa_loads_with_eager_attention(tiny_bert, tmp_path, monkeypatch):
    """No error and no warning: the model runs eager attention and gives the same vectors."""
    import shutil

    from transformers import BertModel

    sentences = _random_sentences(30, seed=9)
    want = Encoder(tiny_bert, pooling="mean").encode(sentences)
    monkeypatch.setattr(BertModel, "_supports_sdpa", False)
    folder = str(shutil.copytree(tiny_bert, tmp_path / "bert"))  # not the loaded model cached for tiny_bert
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        encoder = Encoder(folder, pooling="mean")
    assert encoder._loaded.attention == "eager" and encoder.describe()["attention"] == "eager"
    calls = _count_sdpa_calls(monkeypatch)
    got = encoder.encode(sentences)
    assert not calls
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


def test_local_folder_model_id_is_absolute(tiny_bert, monkeypatch):
    monkeypatch.chdir(os.path.dirname(tiny_bert))
    encoder = Encoder(os.path.basename(tiny_bert), pooling="static-avg")
    assert encoder.model_id == tiny_bert and encoder.dim == 16 and encoder.pooling == "static-avg"


def test_empty_whitespace_and_over_long_texts(tiny_bert):
    encoder = Encoder(tiny_bert, pooling="first-last-avg", max_length=10)
    long_text = " ".join(WORDS)
    with pytest.warns(UserWarning, match=r"2 of 5 texts were longer than 10 tokens"):
        vectors = encoder.encode(["", "   ", long_text, "the cat", long_text], normalize=True)
    assert np.isfinite(vectors).all()
    np.testing.assert_allclose(np.linalg.norm(vectors.astype(np.float64), axis=1), 1.0, rtol=0, atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # exactly max_length tokens is not truncation
        encoder.encode([" ".join(WORDS[:8])])


def test_a_huge_text_is_cut_before_it_is_tokenized_and_keeps_its_vector(tiny_bert, monkeypatch):
    """One huge line costs bounded time and memory: at most max_length x CHARACTERS_PER_TOKEN
    characters reach the tokenizer (cut at a space), and the vector equals that of the whole text
    tokenized then truncated, bit for bit; the text counts as truncated."""
    from flowcore.text import encoder as encoder_module
    encoder = Encoder(tiny_bert, pooling="mean", max_length=10)
    huge = " ".join(WORDS * 20000)  # ~10^6 characters
    seen = []
    tokenizer = encoder._loaded.tokenizer
    original = type(tokenizer).__call__

    def spy(self, texts, *args, **kwargs):
        seen.append(max(len(text) for text in texts))
        return original(self, texts, *args, **kwargs)

    monkeypatch.setattr(type(tokenizer), "__call__", spy)
    with pytest.warns(UserWarning, match=r"1 of 2 texts were longer than 10 tokens"):
        cut = encoder.encode([huge, "the cat"])
    assert max(seen) <= 10 * encoder_module.CHARACTERS_PER_TOKEN
    monkeypatch.setattr(encoder_module, "CHARACTERS_PER_TOKEN", 10**9)  # the whole text tokenized
    with pytest.warns(UserWarning, match=r"1 of 2 texts"):
        whole = encoder.encode([huge, "the cat"])
    assert max(seen) == len(huge)
    np.testing.assert_array_equal(cut, whole)


def test_explicit_dtype_runs_the_model_in_it_and_returns_float32(tiny_bert):
    sentences = _random_sentences(10, seed=5)
    half = Encoder(tiny_bert, pooling="mean", dtype="bfloat16")
    assert next(half._loaded.model.parameters()).dtype == torch.bfloat16
    got = half.encode(sentences)
    assert got.dtype == np.float32
    assert _cosines(got, Encoder(tiny_bert, pooling="mean").encode(sentences)).min() > 0.99
    with pytest.raises(ValueError, match="floating torch dtype"):
        Encoder(tiny_bert, dtype="int8")


def test_progress_shows_rate(tiny_bert, capsys, monkeypatch):
    from flowcore import defaults

    monkeypatch.setattr(defaults, "PROGRESS_INTERVAL_S", 0.0)  # stderr is not a terminal here: progress lines
    Encoder(tiny_bert).encode(_random_sentences(20), show_progress_bar=True)
    err = capsys.readouterr().err
    assert re.search(r"^encode: (\d+) of \1 sentences \(100%\), [\d,]+ sentences/s", err, re.M) and "\r" not in err
    Encoder(tiny_bert).encode(_random_sentences(20))
    assert capsys.readouterr().err == ""


def _spy_on_thread_counts(encoder, monkeypatch) -> list[tuple[int, int]]:
    """(torch thread count, Python thread) at each forward of `encoder`, appended as it encodes."""
    import threading

    seen = []
    real_forward = encoder._hidden_states

    def spying(inputs):
        seen.append((torch.get_num_threads(), threading.get_ident()))
        return real_forward(inputs)

    monkeypatch.setattr(encoder, "_hidden_states", spying)
    return seen


def test_default_threads_are_fixed_so_output_is_reproducible(tiny_bert, monkeypatch):
    """threads=None: torch's count capped at the CPUs, as that many batches side by side on one
    torch thread each (one batch at a time on one thread when that count is 1)."""
    encoder = Encoder(tiny_bert, pooling="mean")
    seen = _spy_on_thread_counts(encoder, monkeypatch)
    before = torch.get_num_threads()
    sentences = _random_sentences(30)
    first = encoder.encode(sentences, batch_size=4)
    assert seen and {count for count, _ in seen} == {1}
    assert len({thread for _, thread in seen}) <= min(before, available_cpus())
    assert torch.get_num_threads() == before
    np.testing.assert_array_equal(encoder.encode(sentences, batch_size=4), first)


def test_batches_side_by_side_give_the_vectors_of_one_thread(tiny_bert, monkeypatch):
    """threads=3: batches run on 3 worker threads of one torch thread each (never more), so a
    busy core slows one worker instead of every op; each batch is computed exactly as on one
    thread, so the vectors are bit for bit those of threads=1, whatever the load."""
    import threading

    sentences = _random_sentences(60)
    alone = Encoder(tiny_bert, pooling="mean", threads=1).encode(sentences, batch_size=4)
    encoder = Encoder(tiny_bert, pooling="mean", threads=3)
    seen = _spy_on_thread_counts(encoder, monkeypatch)
    side_by_side = encoder.encode(sentences, batch_size=4)
    np.testing.assert_array_equal(side_by_side, alone)
    threads = {thread for _, thread in seen}
    assert {count for count, _ in seen} == {1} and 1 <= len(threads) <= 3
    assert threading.get_ident() not in threads


def test_a_failing_batch_on_a_worker_thread_is_raised(tiny_bert, monkeypatch):
    encoder = Encoder(tiny_bert, pooling="mean", threads=2)
    calls = []

    def failing(inputs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("batch 3 failed")
        return real(inputs)

    real = encoder._hidden_states
    monkeypatch.setattr(encoder, "_hidden_states", failing)
    with pytest.raises(RuntimeError, match="batch 3 failed"):
        encoder.encode(_random_sentences(40), batch_size=4)


# ---- errors ----------------------------------------------------------------------------------------

def test_bad_sentences_give_clear_errors(tiny_bert):
    encoder = Encoder(tiny_bert)
    with pytest.raises(TypeError, match=r"sentences\[2\] is int"):
        encoder.encode(["a", "b", 3])
    with pytest.raises(TypeError, match=r"sentences\[0\] is NoneType"):
        encoder.encode([None])
    with pytest.raises(ValueError, match="empty list"):
        encoder.encode([])
    with pytest.raises(TypeError, match="not a single string"):
        encoder.encode("the cat")
    with pytest.raises(ValueError, match="batch_size"):
        encoder.encode(["a"], batch_size=0)
    with pytest.raises(ValueError, match=r"sentences\[1\] holds a lone surrogate '\\ud800' at character 3"):
        encoder.encode(["fine", "bad\ud800text"])


def test_bad_pooling_and_model_give_clear_errors(tiny_bert, tmp_path):
    with pytest.raises(ValueError, match="unknown pooling 'max'.*first-last-avg"):
        Encoder(tiny_bert, pooling="max")
    with pytest.raises(ValueError, match="layer 4 does not exist.*0..3"):
        Encoder(tiny_bert, layers=[1, 4])
    with pytest.raises(ValueError, match="same hidden state twice"):
        Encoder(tiny_bert, layers=[3, -1])
    with pytest.raises(ValueError, match="either pooling='mean' or layers"):
        Encoder(tiny_bert, pooling="mean", layers=[1])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Encoder(str(tmp_path / "missing" / "folder"))
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        Encoder(str(tmp_path))


def test_a_model_folder_with_only_pickled_weights_is_refused_unread(tiny_bert, tmp_path, monkeypatch):
    import shutil

    folder = tmp_path / "pickled"
    shutil.copytree(tiny_bert, folder)
    from safetensors.torch import load_file

    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()

    def no_unpickling(*args, **kwargs):
        raise AssertionError("torch.load was called on a model file")

    monkeypatch.setattr(torch, "load", no_unpickling)
    with pytest.raises(OSError, match=r"no \.safetensors weights.*never unpickles.*save_pretrained"):
        Encoder(str(folder))


def test_uncached_hub_name_says_how_to_pass_a_local_folder():
    with pytest.raises(FileNotFoundError, match=r"not in the Hugging Face cache.*local folder.*Encoder\(model="):
        Encoder("nobody/no-such-model-xyz")


def test_pinned_threads_are_used_and_restored(tiny_bert, monkeypatch):
    encoder = Encoder(tiny_bert, pooling="mean", threads=2)
    seen = _spy_on_thread_counts(encoder, monkeypatch)
    before = torch.get_num_threads()
    encoder.encode(_random_sentences(50), batch_size=8)
    assert seen and {count for count, _ in seen} == {1} and len({thread for _, thread in seen}) <= 2
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        Encoder(tiny_bert, threads=0)
