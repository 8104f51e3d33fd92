"""Hostile and odd stored embeddings (property-based), through `flowcore calibrate`: .npy files of
every dtype, 1-D/3-D, Fortran order, object, structured and pickled arrays, truncated, damaged
or appended files, NaN/Inf and huge values; parquet vector columns of every list type, nulls,
null elements and wrong widths. Each file is either refused in one line naming it, or every row
is calibrated (equal to the in-memory flow) or rejected in place, never dropped or shifted."""
import io
import json
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from faults_support import DIM
from hypothesis import example, given
from hypothesis import strategies as st

from flowcore import FlowCalibrator
from flowcore.batch.core import calibrated
from flowcore.batch.rows import BEYOND_FLOAT32, MISSING_VECTOR, NON_FINITE, NON_FINITE_OUTPUT, WRONG_WIDTH
from flowcore.cli import main

DTYPES = ["<f4", ">f4", "<f8", "<f2", "g", "<i4", "u1", "?", "<c8", "<U3", "S4", "O", "M8[s]",
          [("a", "<f4"), ("b", "<f4", (7,))]]
SPECIALS = [np.nan, np.inf, -np.inf, 1e39, -0.0, 3.0e38]


def calibrate(flow_path, source, out, capsys) -> tuple[int, str]:
    code = main(["calibrate", "--calibrator", str(flow_path), "--embeddings", str(source), "--out", str(out),
                 "--chunk-rows", "16", "--quiet"])
    return code, capsys.readouterr().err


def assert_refused_in_one_line(code: int, err: str, path) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"flowcore calibrate: error: {path}"), err


def assert_every_row_in_place(out, rows: np.ndarray, usable: np.ndarray, flow_path) -> None:
    """Row i of `out` is the flow of `rows[i]` where `usable[i]` and the flow's output is finite,
    and NaN (with a rejects line) otherwise; the rejects count the rest."""
    result = np.load(out)
    assert result.shape == (len(rows), DIM)
    expected = np.full((len(rows), DIM), np.nan, dtype=np.float32)
    if usable.any():  # the flow's output, rows it maps to NaN/Inf included (its transform refuses those)
        expected[usable] = calibrated(FlowCalibrator.load(flow_path).transform, rows[usable])
    ok = np.isfinite(expected).all(axis=1)
    np.testing.assert_allclose(result[ok], expected[ok], rtol=1e-5, atol=1e-5)
    assert np.isnan(result[~ok]).all()
    rejects = [json.loads(line) for line in open(f"{out}.rejects.jsonl", encoding="utf-8")]
    assert [reject["row"] for reject in rejects] == np.flatnonzero(~ok).tolist()
    output_rejects = {reject["row"] for reject in rejects if reject["reason"] == NON_FINITE_OUTPUT}
    assert output_rejects == set(np.flatnonzero(usable & ~ok).tolist())
    manifest = json.loads(open(f"{out}.manifest.json", encoding="utf-8").read())
    assert manifest["rows"] == len(rows) and manifest["ok"] + manifest["rejected"] == len(rows)


@st.composite
def npy_files(draw):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    rows = draw(st.integers(0, 40))
    shape = draw(st.sampled_from([(rows, DIM), (rows, DIM), (rows,), (rows, DIM, 2), (rows, DIM - 1), (rows, 1)]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    values = rng.normal(size=shape) * draw(st.sampled_from([1.0, 1e3]))
    flat = values.reshape(-1)
    for _ in range(draw(st.integers(0, 4))):
        if flat.size:
            flat[draw(st.integers(0, flat.size - 1))] = draw(st.sampled_from(SPECIALS))
    if dtype.fields is not None:
        array = np.zeros(rows, dtype=dtype)
    elif dtype.kind == "O":
        array = values.astype(object)
    else:
        with np.errstate(all="ignore"):
            array = values.astype(dtype)
    fortran = draw(st.booleans())
    damage = draw(st.sampled_from(["none", "none", "truncate", "flip", "append", "negative"]))
    return array, fortran, damage, draw(st.integers(0, 2**31))


@given(npy=npy_files())
@example(npy=(np.empty((0, DIM), np.float32), False, "flip", 10))  # a header numpy's parser chokes on (long soak)
def test_npy_files_of_every_kind_are_refused_in_one_line_or_calibrated_row_by_row(tmp_path_factory, flow_path, capsys,
                                                                                   npy):
    array, fortran, damage, where = npy
    folder = tmp_path_factory.mktemp("npy")
    path = folder / "in.npy"
    np.save(path, np.asfortranarray(array) if fortran else array, allow_pickle=True)
    data = path.read_bytes()
    if damage == "truncate":
        data = data[: where % len(data)]
    elif damage == "flip":
        position = where % len(data)
        data = data[:position] + bytes([data[position] ^ (1 << (where % 8))]) + data[position + 1:]
    elif damage == "append":
        data += b"\0" * (1 + where % 64)
    elif damage == "negative":  # the same data under a header that gives a negative size
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": np.lib.format.dtype_to_descr(array.dtype),
                                                      "fortran_order": False, "shape": (-1 - where % 40, DIM)})
        data = header.getvalue() + data[len(header.getvalue()):]
    path.write_bytes(data)
    code, err = calibrate(flow_path, path, folder / "out.npy", capsys)

    usable_layout = (array.dtype.kind == "f" and array.ndim == 2 and array.shape[1] == DIM
                     and not (fortran and array.shape[0] > 1))
    if damage in ("truncate", "append", "negative") or (damage == "none" and not usable_layout):
        assert_refused_in_one_line(code, err, path)
        return
    if code == 2:  # a flipped bit may leave a valid file of another meaning, or a refused one
        assert damage == "flip"
        assert_refused_in_one_line(code, err, path)
        return
    assert code == 0, err
    stored = np.load(path, allow_pickle=False)
    with np.errstate(all="ignore"):
        rows = np.asarray(stored, dtype=np.float32)
    assert_every_row_in_place(folder / "out.npy", rows, np.isfinite(rows).all(axis=1), flow_path)


class _Trap:
    """Unpickling this would create the marker file: proof that nothing unpickled it."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def test_a_pickled_object_array_is_refused_and_never_unpickled(tmp_path, flow_path, capsys):
    marker = tmp_path / "unpickled"
    array = np.empty((3, DIM), dtype=object)
    array[:] = _Trap(marker)
    np.save(tmp_path / "in.npy", array, allow_pickle=True)
    code, err = calibrate(flow_path, tmp_path / "in.npy", tmp_path / "out.npy", capsys)
    assert_refused_in_one_line(code, err, tmp_path / "in.npy")
    assert "expected a numeric array, got dtype object" in err
    assert not marker.exists()


VALUE_TYPES = {"list<float32>": pa.list_(pa.float32()), "list<float64>": pa.list_(pa.float64()),
               "list<int64>": pa.list_(pa.int64()), "large_list<float32>": pa.large_list(pa.float32()),
               "fixed<float32>[8]": pa.list_(pa.float32(), DIM), "list<string>": pa.list_(pa.string()),
               "list<list<float32>>": pa.list_(pa.list_(pa.float32())), "string": pa.string()}
element = st.one_of(st.floats(-1e3, 1e3, width=32), st.sampled_from([np.nan, np.inf, None]))


@given(kind=st.sampled_from(list(VALUE_TYPES)),
       vectors=st.lists(st.one_of(st.none(), st.lists(st.floats(-3, 3, width=32), min_size=DIM, max_size=DIM),
                                  st.lists(element, min_size=DIM, max_size=DIM),
                                  st.lists(st.floats(-3, 3, width=32), min_size=0, max_size=DIM + 2)),
                        max_size=40))
def test_parquet_vector_columns_of_every_kind_are_refused_or_calibrated_row_by_row(tmp_path_factory, flow_path,
                                                                                   capsys, kind, vectors):
    folder = tmp_path_factory.mktemp("parquet")
    path = folder / "in.parquet"
    kind_type = VALUE_TYPES[kind]
    if kind == "fixed<float32>[8]":
        vectors = [v if v is None or len(v) == DIM else None for v in vectors]
    if kind in ("list<int64>", "list<string>", "string", "list<list<float32>>"):
        convert = {"list<int64>": lambda x: None if x is None or x != x or abs(x) == np.inf else int(x),
                   "list<string>": lambda x: None if x is None else str(x)}.get(kind)
        if kind == "string":
            column = pa.array([None if v is None else str(v) for v in vectors], kind_type)
        elif kind == "list<list<float32>>":
            column = pa.array([None if v is None else [v] for v in vectors], kind_type)
        else:
            column = pa.array([None if v is None else [convert(x) for x in v] for v in vectors], kind_type)
    else:
        column = pa.array(vectors, kind_type)
    pq.write_table(pa.table({"embedding": column}), path, row_group_size=9)
    code, err = calibrate(flow_path, path, folder / "out.npy", capsys)

    numeric = kind not in ("list<string>", "string", "list<list<float32>>")
    if not numeric:
        assert_refused_in_one_line(code, err, path)
        return
    if code == 2:  # the width it reads off the first rows is not the flow's
        assert "-wide vectors but the calibrator expects 8" in err or "has no vectors" in err
        assert_refused_in_one_line(code, err, path)
        return
    assert code == 0, err
    stored = column.to_pylist()
    rows = np.full((len(stored), DIM), np.nan, dtype=np.float32)
    reasons = {}
    for row, vector in enumerate(stored):
        if vector is None:
            reasons[row] = MISSING_VECTOR
        elif len(vector) != DIM:
            reasons[row] = WRONG_WIDTH
        else:
            rows[row] = [np.nan if x is None else x for x in vector]
            if not np.isfinite(rows[row]).all():
                reasons[row] = NON_FINITE
    assert_every_row_in_place(folder / "out.npy", rows, np.isfinite(rows).all(axis=1), flow_path)
    rejects = {r["row"]: r["reason"] for r in map(json.loads, open(f"{folder / 'out.npy'}.rejects.jsonl"))}
    assert {row: reason for row, reason in rejects.items() if reason != NON_FINITE_OUTPUT} == reasons


@pytest.mark.parametrize("width", [DIM - 1, DIM + 1])
def test_npy_vectors_of_another_width_are_refused_before_any_work(tmp_path, flow_path, capsys, width):
    np.save(tmp_path / "in.npy", np.zeros((5, width), dtype=np.float32))
    code, err = calibrate(flow_path, tmp_path / "in.npy", tmp_path / "out.npy", capsys)
    assert_refused_in_one_line(code, err, tmp_path / "in.npy")
    assert f"holds {width}-wide vectors but the calibrator expects {DIM}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npy"]


def test_a_finite_float64_beyond_float32_is_named_for_what_it_is(tmp_path, flow_path, capsys):
    rows = np.random.default_rng(0).normal(size=(6, DIM))
    rows[2, 3], rows[4, 0] = 1e39, np.inf
    np.save(tmp_path / "in.npy", rows)
    pq.write_table(pa.table({"embedding": pa.array(rows.tolist(), pa.list_(pa.float64()))}), tmp_path / "in.parquet")
    for source in ("in.npy", "in.parquet"):
        code, err = calibrate(flow_path, tmp_path / source, tmp_path / "out.npy", capsys)
        assert code == 0, err
        rejects = [json.loads(line) for line in open(tmp_path / "out.npy.rejects.jsonl", encoding="utf-8")]
        assert [(r["row"], r["reason"]) for r in rejects] == [(2, BEYOND_FLOAT32), (4, NON_FINITE)]
        assert rejects[0]["detail"] == "a finite value beyond float32's range (about ±3.4e38)"


@pytest.mark.parametrize("vector_type", [pa.list_(pa.float32()), pa.list_(pa.float32(), DIM)])
def test_a_parquet_file_without_rows_gives_an_empty_output_whatever_its_list_type(tmp_path, flow_path, capsys,
                                                                                vector_type):
    schema = pa.schema([("embedding", vector_type)])
    with pq.ParquetWriter(tmp_path / "in.parquet", schema):  # no row group at all
        pass
    assert pq.ParquetFile(tmp_path / "in.parquet").num_row_groups == 0
    code, err = calibrate(flow_path, tmp_path / "in.parquet", tmp_path / "out.npy", capsys)
    assert code == 0, err
    assert np.load(tmp_path / "out.npy").shape == (0, DIM)


def test_a_parquet_file_of_null_vectors_rejects_each_row(tmp_path, flow_path, capsys):
    pq.write_table(pa.table({"embedding": pa.array([None, None], pa.list_(pa.float32()))}), tmp_path / "in.parquet")
    code, err = calibrate(flow_path, tmp_path / "in.parquet", tmp_path / "out.npy", capsys)
    assert code == 0, err
    assert [json.loads(line)["reason"] for line in open(tmp_path / "out.npy.rejects.jsonl")] == [MISSING_VECTOR] * 2


def test_two_parquet_columns_of_the_name_read_are_refused_in_one_line(tmp_path, flow_path, capsys):
    vectors = pa.array(np.zeros((3, DIM)).tolist(), pa.list_(pa.float32()))
    pq.write_table(pa.Table.from_arrays([vectors, vectors], names=["embedding", "embedding"]), tmp_path / "in.parquet")
    code, err = calibrate(flow_path, tmp_path / "in.parquet", tmp_path / "out.npy", capsys)
    assert_refused_in_one_line(code, err, tmp_path / "in.parquet")
    assert "2 columns are named 'embedding'; rename them so that the one to read is named once" in err


def test_a_dictionary_encoded_id_column_is_read_like_a_plain_one(tmp_path, flow_path):
    from flowcore.batch.job import calibrate_file

    ids = pa.array(["a", "b", "a"]).dictionary_encode()
    vectors = pa.array(np.random.default_rng(0).normal(size=(3, DIM)).tolist(), pa.list_(pa.float32()))
    pq.write_table(pa.table({"id": ids, "embedding": vectors}), tmp_path / "in.parquet")
    calibrate_file(flow_path, tmp_path / "out.parquet", embeddings=tmp_path / "in.parquet", id_field="id",
                   show_progress_bar=False)
    assert pq.read_table(tmp_path / "out.parquet").column("id").to_pylist() == ["a", "b", "a"]


@pytest.mark.parametrize("layout", ["int64", "fortran"])
def test_fit_and_calibrate_read_npy_files_by_one_rule(tmp_path, flow_path, capsys, layout):
    rows = np.random.default_rng(0).normal(size=(50, DIM))
    np.save(tmp_path / "in.npy", rows.astype(np.int64) if layout == "int64" else np.asfortranarray(rows))
    code, err = calibrate(flow_path, tmp_path / "in.npy", tmp_path / "out.npy", capsys)
    assert_refused_in_one_line(code, err, tmp_path / "in.npy")
    assert main(["fit", "--embeddings", str(tmp_path / "in.npy"), "--out", str(tmp_path / "w.flow")]) == 2
    fit_error = capsys.readouterr().err.strip()
    assert fit_error == err.strip().replace("flowcore calibrate", "flowcore fit")
    assert not (tmp_path / "w.flow").exists()
