"""What the local job rejects, the Ray engine (`calibrate_ray`) and `flowcore.ray.Calibrate` reject
the same way: the same hostile rows (empty, missing and non-text text, a lone surrogate; a
missing, wrong-width or NaN vector, a finite vector the flow maps to NaN) give each engine the
same reasons row by row, and the same vectors for the good rows. Rows only a Ray Dataset can
hold (a string or a list of strings where a vector belongs) are rejects there, never a crash."""
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flowcore import FlowCalibrator
from flowcore.batch.job import calibrate_file
from flowcore.batch.rows import (
    BEYOND_FLOAT32,
    BROKEN_CSV,
    EMPTY_LINE,
    EMPTY_TEXT,
    INVALID_ID,
    INVALID_UTF8,
    MISSING_TEXT,
    MISSING_VECTOR,
    NON_FINITE,
    NON_FINITE_OUTPUT,
    NOT_A_VECTOR,
    NUL_CHARACTER,
    WRONG_WIDTH,
)
from flowcore.ray import Calibrate, calibrate_ray
from flowcore.validation import NonFiniteOutputError

DIM = 8
ENGINES = ["local", "ray", "Calibrate"]

GOOD = np.random.default_rng(5).normal(size=(2, DIM)).tolist()
VECTORS = [GOOD[0], None, [1.0] * (DIM - 1), [np.nan] + [0.0] * (DIM - 1), [None] + [0.0] * (DIM - 1),
           [3.0e38] * DIM, [1e39] + [0.0] * (DIM - 1), GOOD[1]]
VECTOR_REASONS = {1: MISSING_VECTOR, 2: WRONG_WIDTH, 3: NON_FINITE, 4: NON_FINITE, 5: NON_FINITE_OUTPUT,
                  6: BEYOND_FLOAT32}
NOT_VECTORS = ["abc", ["a"] * DIM, [True] * DIM]  # only a Ray Dataset can hold these where vectors belong

ABSENT = object()
TEXTS = ["the cat sat", "", "   ", None, 5, "\ud800 dog", "a dog ran", {"k": 1}, ABSENT, "big red house"]
TEXT_REASONS = {1: EMPTY_TEXT, 2: EMPTY_TEXT, 3: MISSING_TEXT, 4: MISSING_TEXT, 5: INVALID_UTF8, 7: MISSING_TEXT,
                8: MISSING_TEXT}



def test_the_premise_the_flow_maps_a_huge_finite_row_to_nan_or_inf(vector_flow):
    with pytest.raises(NonFiniteOutputError):
        FlowCalibrator.load(vector_flow).transform(np.full((1, DIM), 3.0e38, np.float32))


def _matrix(column) -> np.ndarray:
    values = column.combine_chunks()
    matrix = np.full((len(values), values.type.list_size), np.nan, dtype=np.float32)
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    matrix[valid] = values.filter(values.is_valid()).flatten().to_numpy().reshape(-1, values.type.list_size)
    return matrix


def calibrate_with(engine: str, request, tmp_path, flow, column: str, values: list, path) -> tuple[dict, np.ndarray]:
    """Run `engine` over rows whose `column` holds `values` (the file engines read them from
    `path`); returns ({row: reason} of the rejects, the calibrated vectors)."""
    if engine == "local":
        out = tmp_path / "out.parquet"
        calibrate_file(flow, out, **{"input" if column == "text" else "embeddings": path}, chunk_rows=4, threads=1,
                       show_progress_bar=False)
        rejects = [json.loads(line) for line in open(f"{out}.rejects.jsonl", encoding="utf-8")]
        return {r["row"]: r["reason"] for r in rejects}, _matrix(pq.read_table(out).column("embedding"))
    ray = request.getfixturevalue("ray_session")
    if engine == "ray":
        out = tmp_path / "out"
        calibrate_ray(flow, out, **{"input" if column == "text" else "embeddings": str(path)}, chunk_rows=4,
                      threads=1, num_workers=1, show_progress_bar=False)
        rejects = [json.loads(line) for line in open(out / "rejects.jsonl", encoding="utf-8")]
        tables = [pq.read_table(shard) for shard in sorted((out / "shards").glob("part-*.parquet"))]
        return {r["row"]: r["reason"] for r in rejects}, _matrix(pa.concat_tables(tables).column("embedding"))
    items = [{"id": row, **({} if value is ABSENT else {column: value})} for row, value in enumerate(values)]
    options = {"flow": str(flow), **({"vector_column": column} if column != "text" else {})}
    rows = ray.data.from_items(items, override_num_blocks=1).map_batches(
        Calibrate, fn_constructor_kwargs=options, compute=ray.data.ActorPoolStrategy(size=1), batch_size=64,
        batch_format="numpy").take_all()
    rows = sorted(rows, key=lambda row: row["id"])
    assert [row["id"] for row in rows] == list(range(len(values)))  # nothing dropped
    return ({row["id"]: row["reject"] for row in rows if row["reject"]},
            np.stack([np.asarray(row["embedding"], dtype=np.float32) for row in rows]))


@pytest.mark.parametrize("engine", ENGINES)
def test_hostile_vectors_are_rejected_alike_by_every_engine(engine, request, tmp_path, vector_flow):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"embedding": pa.array(VECTORS, pa.list_(pa.float64()))}), path)
    values = VECTORS + (NOT_VECTORS if engine == "Calibrate" else [])
    reasons, vectors = calibrate_with(engine, request, tmp_path, vector_flow, "embedding", values, path)
    expected = {**VECTOR_REASONS, **{len(VECTORS) + i: NOT_A_VECTOR for i in range(len(values) - len(VECTORS))}}
    assert reasons == expected
    assert np.isnan(vectors[sorted(expected)]).all()
    reference = FlowCalibrator.load(vector_flow).transform(np.array(GOOD, dtype=np.float32))
    np.testing.assert_allclose(vectors[[0, 7]], reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("engine", ENGINES)
def test_hostile_texts_are_rejected_alike_by_every_engine(engine, request, tmp_path, text_flow):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({} if text is ABSENT else {"text": text}) + "\n" for text in TEXTS))
    reasons, vectors = calibrate_with(engine, request, tmp_path, text_flow, "text", TEXTS, path)
    assert reasons == TEXT_REASONS
    good = [row for row in range(len(TEXTS)) if row not in TEXT_REASONS]
    assert np.isnan(vectors[sorted(TEXT_REASONS)]).all() and np.isfinite(vectors[good]).all()
    local = tmp_path / "local.parquet"
    if engine != "local":  # the local job's vectors, to compare with
        calibrate_file(text_flow, local, input=path, chunk_rows=4, threads=1, show_progress_bar=False)
        np.testing.assert_allclose(vectors[good], _matrix(pq.read_table(local).column("embedding"))[good], rtol=1e-5,
                                   atol=1e-6)


HUGE_LINE = "the cat sat " * 200_000  # 2.4 MB on one line: cut before it is tokenized, one vector
HOSTILE_FILES = {  # name: (file name, bytes, id field, {row: (line, reason, id)} or the start of a refusal)
    "unclosed CSV quote": ("c.csv", b'id,text\n1,the cat\n2,"a dog ran\n3,big red house\n', "id",
                           {1: (3, BROKEN_CSV, None)}),
    "NUL bytes": ("c.txt", b"the cat\n\x00\x00\x00\n" + "a dog".encode("utf-16-le") + b"\nred house\n", None,
                  {1: (2, NUL_CHARACTER, None), 2: (3, NUL_CHARACTER, None)}),
    "UTF-16 text": ("c.txt", "the cat\na dog\n".encode("utf-16"), None, "starts with a UTF-16 (little-endian)"),
    "invalid UTF-8": ("c.txt", b"the cat\nsat \xff on\n\nred\n", None, {1: (2, INVALID_UTF8, None),
                                                                       2: (3, EMPTY_LINE, None)}),
    "jsonl ids": ("c.jsonl", b'{"id": {"k": 1}, "text": "the cat"}\n{"id": NaN, "text": "a"}\n'
                             b'{"id": 1e999, "text": "a"}\n{"id": "e", "text": ""}\n{"id": 2, "text": "red"}\n', "id",
                  {1: (2, INVALID_ID, None), 2: (3, INVALID_ID, None), 3: (4, EMPTY_TEXT, "e")}),
    "a huge line": ("c.txt", b"the cat\n" + HUGE_LINE.encode() + b"\nred\n", None, {}),
}


@pytest.mark.parametrize("engine", ["local", "ray"])
@pytest.mark.parametrize("case", sorted(HOSTILE_FILES))
def test_hostile_files_are_read_alike_by_both_engines(engine, case, request, tmp_path, text_flow):
    """The readers under both engines: the same rows rejected with the same lines, reasons and
    ids, the same ids on the good rows, or the same one-line refusal naming the file."""
    name, data, id_field, expected = HOSTILE_FILES[case]
    path = tmp_path / name
    path.write_bytes(data)
    options = dict(input=str(path), id_field=id_field, chunk_rows=4, threads=1, show_progress_bar=False)
    if engine == "local":
        out = tmp_path / "out.parquet"
        run = lambda: calibrate_file(text_flow, out, **options)  # noqa: E731
        rejects_path, tables = Path(f"{out}.rejects.jsonl"), lambda: [pq.read_table(out)]
    else:
        request.getfixturevalue("ray_session")
        out = tmp_path / "out"
        run = lambda: calibrate_ray(text_flow, out, num_workers=1, **options)  # noqa: E731
        rejects_path = out / "rejects.jsonl"
        tables = lambda: [pq.read_table(shard) for shard in sorted((out / "shards").glob("part-*.parquet"))]  # noqa
    if isinstance(expected, str):
        with pytest.raises(ValueError) as refused:
            run()
        assert str(refused.value).startswith(f"{path}: {expected}") and "\n" not in str(refused.value)
        return
    run()
    rejects = [json.loads(line) for line in open(rejects_path, encoding="utf-8")]
    assert {r["row"]: (r["line"], r["reason"], r.get("id")) for r in rejects} == expected
    table = pa.concat_tables(tables())
    vectors = _matrix(table.column("embedding"))
    assert np.isnan(vectors[sorted(expected)]).all()
    assert np.isfinite(np.delete(vectors, sorted(expected), axis=0)).all()
    if id_field:
        ids = table.column("id").to_pylist()
        assert [ids[row] for row in expected] == [reject_id for _, _, reject_id in expected.values()]
        assert ids == {"jsonl ids": ['{"k":1}', None, None, "e", "2"], "unclosed CSV quote": ["1", None, "3"]}[case]
