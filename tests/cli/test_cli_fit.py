"""`flowcore fit`: embeddings or text in, a loadable calibrator file out (auto by default, saying
what it chose and why; a flow saying what it kept and why), clear errors otherwise."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import flowcore
from flowcore.calibration.file import EncoderProvenance
from flowcore.cli import main


@pytest.fixture
def embeddings(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "emb.npy"
    np.save(path, (rng.normal(size=(300, 16)) @ rng.normal(size=(16, 16))).astype(np.float32))
    return path


def test_fit_embeddings_writes_a_flow(embeddings, tmp_path, capsys):
    out = tmp_path / "model.flow"
    assert main(["fit", "--embeddings", str(embeddings), "--out", str(out), "--calibration", "flow", "--config",
                 "l2_d2_w32", "--epochs", "2", "--train-batch-size", "64", "--seed", "4"]) == 0
    captured = capsys.readouterr()
    assert "warning" not in captured.err  # 300 >= 5 x 16
    line = captured.out.strip()
    assert line.startswith("flow l2_d2_w32 (whitened recipe): kept ") and len(line.splitlines()) == 1
    assert "; fitted on 300 x 16 in " in line
    assert line.endswith(f"s; wrote {out}")
    calibrator = flowcore.FlowCalibrator.load(out)
    assert (calibrator.config, calibrator.epochs, calibrator.seed, calibrator.dim) == ("l2_d2_w32", 2, 4, 16)
    expected = flowcore.FlowCalibrator(config="l2_d2_w32", epochs=2, batch_size=64, seed=4).fit(
        np.load(embeddings), show_progress_bar=False)
    np.testing.assert_array_equal(calibrator.transform(np.load(embeddings)), expected.transform(np.load(embeddings)))


def test_fit_takes_the_bert_flow_code_coupling_and_permutation(embeddings, tmp_path, capsys):
    out = tmp_path / "model.flow"
    assert main(["fit", "--embeddings", str(embeddings), "--out", str(out), "--calibration", "flow", "--config",
                 "l2_d2_w32", "--coupling", "additive", "--permutation", "reverse", "--recipe", "paper"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("flow l2_d2_w32 (additive coupling, reverse permutation, paper recipe): ")
    assert "; fitted on 300 x 16 in " in printed
    calibrator = flowcore.load(out)
    assert (calibrator.coupling, calibrator.permutation) == ("additive", "reverse")
    assert main(["fit", "--embeddings", str(embeddings), "--out", str(out), "--calibration", "flow",
                 "--permutation", "reverse"]) == 2
    assert "the 'whitened' recipe starts the flow at whitening" in capsys.readouterr().err


def test_small_corpus_warning_counts_distinct_rows(tmp_path, capsys):
    rng = np.random.default_rng(1)
    path = tmp_path / "repeated.npy"
    np.save(path, np.repeat(rng.normal(size=(30, 16)), 10, axis=0).astype(np.float32))  # 300 rows, 30 distinct
    assert main(["fit", "--embeddings", str(path), "--out", str(tmp_path / "r.flow")]) == 0
    err = capsys.readouterr().err
    assert "flowcore fit: warning: the fit corpus has only 30 distinct vectors for 16-dimensional" in err
    assert "via --embeddings of more sentences" in err
    assert "5 x 16 = 80" in err


def test_max_rows_is_a_reproducible_sample(embeddings, tmp_path):
    outputs = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.flow"
        assert main(["fit", "--embeddings", str(embeddings), "--out", str(out), "--max-rows", "100",
                     "--calibration", "flow", "--config", "l2_d2_w32"]) == 0
        outputs.append(flowcore.FlowCalibrator.load(out).transform(np.load(embeddings)))
    np.testing.assert_array_equal(outputs[0], outputs[1])


def test_fit_text_records_encoder_and_pooling(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    lines = [f"sentence number {i} about {'cats' if i % 2 else 'the stock market'}" for i in range(40)]
    corpus.write_text("\n".join(lines[:20] + [""] + lines[20:]) + "\n")
    out = tmp_path / "text.flow"
    assert main(["fit", "--input", str(corpus), "--out", str(out), "--pooling", "mean", "--calibration", "flow",
                 "--config", "l2_d2_w32", "--train-batch-size", "8"]) == 0
    captured = capsys.readouterr()
    assert "skipped 1 unusable row(s)" in captured.out
    assert ("flowcore fit: warning: the fit corpus has only 40 distinct sentences for 384-dimensional "
                            "vectors, fewer than 5 x 384 = 1920: whitening and the flow fitted on it are unreliable; "
                            "fit on a larger corpus, e.g. NLI sentences via --input FILE\n") in captured.err
    calibrator = flowcore.FlowCalibrator.load(out)
    assert calibrator.provenance == EncoderProvenance("default", "mean") and calibrator.metadata == {}
    assert calibrator.dim == 384


def test_errors_are_one_clean_line(tmp_path):
    bad = tmp_path / "bad.npy"
    np.save(bad, np.ones((5, 3, 2), dtype=np.float32))
    result = subprocess.run([sys.executable, "-m", "flowcore", "fit", "--embeddings", str(bad), "--out",
                             str(tmp_path / "x.flow")], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == f"flowcore fit: error: {bad}: expected a 2-D (rows, dim) array, got shape (5, 3, 2)"
    nan = tmp_path / "nan.npy"
    values = np.random.default_rng(0).normal(size=(50, 8)).astype(np.float32)
    values[31, 2] = np.nan
    np.save(nan, values)
    result = subprocess.run([sys.executable, "-m", "flowcore", "fit", "--embeddings", str(nan), "--out",
                             str(tmp_path / "x.flow")], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2 and "row(s) 31" in result.stderr and "Traceback" not in result.stderr


def test_divergence_and_bad_devices_are_one_line_errors(embeddings, tmp_path, capsys):
    out = str(tmp_path / "m.flow")
    assert main(["fit", "--embeddings", str(embeddings), "--out", out, "--calibration", "flow", "--lr", "1e6",
                 "--epochs", "3", "--config", "l2_d2_w32"]) == 2
    assert "lower learning rate" in capsys.readouterr().err
    assert main(["fit", "--embeddings", str(embeddings), "--out", out, "--device", "bogus"]) == 2
    assert "--device 'bogus' is not a torch device" in capsys.readouterr().err
    assert main(["fit", "--embeddings", str(embeddings), "--out", out, "--device", "cuda"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


class _Killed(Exception):
    """A kill -9 just after a checkpoint was written (checkpoints are atomic: a kill at any other
    moment only loses the steps since the last one)."""


def test_killed_fit_resumes_from_its_checkpoint_to_the_same_model(tmp_path, monkeypatch):
    import flowcore.flows.train as train

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i} of a corpus about {'cats' if i % 3 else 'rivers'}\n" for i in range(60))
                      + "\n")  # 60 sentences and one empty line (a reject)
    command = ["fit", "--input", str(corpus), "--pooling", "mean", "--calibration", "flow", "--config", "l2_d2_w32",
               "--epochs", "2", "--train-batch-size", "8", "--checkpoint-every", "3", "--patience", "9",
               "--cache-dir", str(tmp_path / "cache")]
    uninterrupted = tmp_path / "a" / "model.flow"
    uninterrupted.parent.mkdir()
    assert main([*command, "--out", str(uninterrupted)]) == 0

    killed = tmp_path / "b" / "model.flow"
    killed.parent.mkdir()
    real_save, saves = train._save_checkpoint, []

    def save_then_die(*args, **kwargs):
        real_save(*args, **kwargs)
        saves.append(1)
        if len(saves) == 2:
            raise _Killed

    monkeypatch.setattr(train, "_save_checkpoint", save_then_die)
    with pytest.raises(_Killed):
        main([*command, "--out", str(killed)])
    monkeypatch.setattr(train, "_save_checkpoint", real_save)
    checkpoint = killed.with_name("model.flow.checkpoint")
    assert checkpoint.exists() and not killed.exists()
    encodes = []
    monkeypatch.setattr(flowcore.Encoder, "encode", lambda self, *a, **k: encodes.append(1))
    assert main([*command, "--out", str(killed)]) == 0
    assert encodes == []  # the finished cache is reused, nothing is encoded again
    assert not checkpoint.exists()
    assert _flow_content(killed) == _flow_content(uninterrupted)  # every tensor byte and header value
    [cache] = (tmp_path / "cache" / "corpora").glob("*.npy")
    assert np.load(cache).shape == (61, 384) and cache.with_name(cache.name + ".rejects.jsonl").exists()
    # the cache's good rows are fitted through their row numbers: the model of a fit on their copy
    vectors = np.load(cache)
    good = vectors[np.isfinite(vectors).all(1)]
    expected = flowcore.FlowCalibrator(config="l2_d2_w32", epochs=2, batch_size=8, patience=9).fit(
        good, show_progress_bar=False)
    np.testing.assert_array_equal(flowcore.FlowCalibrator.load(killed).transform(good), expected.transform(good))


def _flow_content(path):
    """A flow file's header metadata and tensor bytes (safetensors writes the metadata keys in no
    fixed order, so the files themselves are compared by content)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="np") as reader:
        return reader.metadata(), {name: reader.get_tensor(name).tobytes() for name in reader.keys()}


def test_threads_option_trains_on_that_many_threads(embeddings, tmp_path, capsys, monkeypatch):
    import torch

    import flowcore.flows.train as train

    seen = []
    real = train.ProgressReport

    def progress(*args, **kwargs):  # made once per train.fit, on its pinned threads
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(train, "ProgressReport", progress)
    flow = ["--calibration", "flow", "--config", "l2_d2_w32", "--train-batch-size", "32"]
    assert main(["fit", "--embeddings", str(embeddings), "--out", str(tmp_path / "t.flow"), *flow,
                 "--threads", "2"]) == 0
    assert main(["fit", "--embeddings", str(embeddings), "--out", str(tmp_path / "d.flow"), *flow]) == 0
    assert seen == [2, 1]
    capsys.readouterr()
    assert main(["fit", "--embeddings", str(embeddings), "--out", str(tmp_path / "z.flow"), "--calibration", "flow",
                 "--threads", "0"]) != 0
    err = capsys.readouterr().err
    assert "threads must be a positive integer" in err and "Traceback" not in err


def test_the_default_is_auto_and_it_says_what_it_chose_and_why(tmp_path, capsys):
    """Hub-dominated vectors (a narrow cone with a steep spectrum) are whitened, balanced ones kept
    raw; one line says which, on what evidence, and where the file went."""
    rng = np.random.default_rng(3)
    cone, balanced = tmp_path / "cone.npy", tmp_path / "balanced.npy"
    np.save(cone, (rng.normal(size=(1500, 32)) / np.arange(1, 33) + 4).astype(np.float32))
    np.save(balanced, (rng.normal(size=(1500, 32)) + 0.5).astype(np.float32))
    out = tmp_path / "auto.flow"
    assert main(["fit", "--embeddings", str(cone), "--out", str(out), "--seed", "2"]) == 0
    fitted = flowcore.load(out)
    assert fitted.name == "auto" and fitted.choice == "whitening" and fitted.seed == 2
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"auto: whitening, {fitted.signals['dim']} directions (hubness "
                           f"{fitted.signals['hubness']:.3f} ≥ 0.265; measured on only 1500 distinct rows")
    assert "; fitted on 1500 x 32 in " in line and line.endswith(f"s; wrote {out}") and len(line.splitlines()) == 1
    assert main(["fit", "--embeddings", str(balanced), "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith("auto: none, the raw vectors (hubness ")
    assert flowcore.load(out).choice == "none"


@pytest.mark.parametrize("options, method, settings", [
    (["--calibration", "whitening", "--whitening-power", "0.3", "--whitening-dim", "8"], "whitening",
     {"keep": 8, "power": 0.3}),
    (["--calibration", "whitening"], "whitening", {"keep": None, "power": 0.5}),
    (["--calibration", "abtt", "--abtt-k", "3"], "abtt", {"k": 3}),
    (["--calibration", "zca"], "zca", {}), (["--calibration", "center"], "center", {}),
    (["--calibration", "none"], "none", {}),
])
def test_fit_any_method_streams_the_rows_into_a_loadable_file(embeddings, tmp_path, capsys, options, method,
                                                              settings):
    out = tmp_path / f"{method}.flow"
    assert main(["fit", "--embeddings", str(embeddings), "--out", str(out), *options]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(method) and "; fitted on 300 x 16 in " in printed
    loaded = flowcore.load(out)
    assert loaded.name == method and loaded.dim == 16 and loaded.provenance is None
    assert {key: loaded.settings()[key] for key in settings} == settings
    X = np.load(embeddings)
    expected = flowcore.calibration.create(method, **{k: v for k, v in settings.items() if v is not None}).fit(X)
    np.testing.assert_allclose(loaded.transform(X), expected.transform(X), rtol=1e-5, atol=1e-5)


def test_fit_a_method_on_text_records_the_encoder(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"sentence {i} about {'cats' if i % 2 else 'rivers'}\n" for i in range(40)))
    out = tmp_path / "white.flow"
    assert main(["fit", "--input", str(corpus), "--out", str(out), "--pooling", "mean", "--calibration", "whitening",
                 "--whitening-dim", "16"]) == 0
    capsys.readouterr()
    loaded = flowcore.load(out)
    assert loaded.provenance == EncoderProvenance("default", "mean") and loaded.output_dim == 16


@pytest.mark.parametrize("sample", [[], ["--max-rows", "30"]])
def test_fit_on_jsonl_skips_rows_of_hostile_json_and_fits(tmp_path, capsys, sample):
    """A number past the interpreter's digit limit, nesting too deep, a duplicate key: each is one skipped row."""
    lines = [f'{{"text": "sentence {i} about {"cats" if i % 2 else "rivers"}"}}' for i in range(40)]
    lines[3] = '{"n": ' + "9" * 5000 + ', "text": "huge"}'
    lines[5] = '{"text": "deep", "n": ' + "[" * 100_000 + "]" * 100_000 + "}"
    lines[7] = '{"text": "one", "text": "two"}'
    (tmp_path / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["fit", "--input", str(tmp_path / "corpus.jsonl"), "--out", str(tmp_path / "c.flow"), "--pooling",
                 "mean", "--calibration", "center", "--quiet", *sample]) == 0
    out = capsys.readouterr().out
    assert "skipped 3 unusable row(s) (2 broken JSON, 1 duplicate key)" in out
    assert flowcore.load(tmp_path / "c.flow").rows == (37 if not sample else 30)


def test_options_of_another_method_are_one_line_errors(embeddings, tmp_path, capsys):
    out = str(tmp_path / "x.flow")
    for options, message in [
        (["--calibration", "abtt", "--whitening-power", "0.3"],
         "--whitening-power does not apply to --calibration abtt"),
        (["--whitening-dim", "4"], "--whitening-dim does not apply to --calibration auto"),
        (["--calibration", "flow", "--whitening-dim", "4"], "--whitening-dim does not apply to --calibration flow"),
        (["--epochs", "2"], "--epochs does not apply to --calibration auto"),
        (["--calibration", "flow", "--patience", "0"], "--patience must be at least 1, got 0"),
        (["--calibration", "whitening", "--epochs", "2"], "--epochs does not apply to --calibration whitening"),
        (["--calibration", "center", "--config", "l2_d2_w32"],
         "--config does not apply to --calibration center"),
        (["--coupling", "additive"], "--coupling does not apply to --calibration auto"),
        (["--calibration", "whitening", "--whitening-power", "2"], "whitening power must be a number from 0"),
        (["--calibration", "whitening", "--whitening-dim", "17"],
         "whitening cannot keep 17 directions of 16-wide vectors"),
    ]:
        assert main(["fit", "--embeddings", str(embeddings), "--out", out, *options]) == 2
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["fit", "--embeddings", str(embeddings), "--out", out, "--calibration", "pca"])
    assert "invalid choice: 'pca'" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["same-path", "symlink", "hard-link", "directory", "cache-is-input"])
def test_fit_refuses_to_overwrite_its_input_or_a_directory(embeddings, tmp_path, capsys, kind):
    """--out (and --cache) never name the input itself (same path, symlink, hard link) or a
    directory: one line, exit 2, before any work, the input untouched."""
    before = Path(embeddings).read_bytes()
    out = {"same-path": Path(embeddings), "symlink": tmp_path / "link.flow", "hard-link": tmp_path / "hard.flow",
           "directory": tmp_path / "folder.flow", "cache-is-input": tmp_path / "model.flow"}[kind]
    if kind == "symlink":
        out.symlink_to(embeddings)
    elif kind == "hard-link":
        out.hardlink_to(embeddings)
    elif kind == "directory":
        out.mkdir()
    extra = ["--cache", str(embeddings)] if kind == "cache-is-input" else []
    assert main(["fit", "--embeddings", str(embeddings), "--out", str(out), *extra]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and ("is a directory" if kind == "directory" else "is the input") in error
    assert Path(embeddings).read_bytes() == before
