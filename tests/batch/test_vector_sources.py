"""Vector sources: stored embeddings stream as float32 chunks with bad rows NaN and rejected,
resume from a chunk boundary, and unusable .npy files are refused by the one .npy reader
(`NpyMatrix`, also behind `flowcore fit --embeddings`) with the file named."""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flowcore.batch.rows import MISSING_ID, MISSING_VECTOR, NON_FINITE, WRONG_WIDTH
from flowcore.batch.vector_sources import EmbeddingFile, NpyMatrix


def test_npy_embeddings_stream_as_float32_with_bad_rows_nan(tmp_path):
    matrix = np.arange(40, dtype=np.float64).reshape(10, 4)
    matrix[3, 1] = np.nan
    matrix[7, 0] = -np.inf
    np.save(tmp_path / "e.npy", matrix)
    source = EmbeddingFile(tmp_path / "e.npy")
    assert (source.rows, source.dim) == (10, 4)
    chunks = list(source.chunks(4))
    vectors = np.concatenate([chunk.vectors for chunk in chunks])
    assert vectors.dtype == np.float32
    assert [(r.row, r.reason) for c in chunks for r in c.rejects] == [(3, NON_FINITE), (7, NON_FINITE)]
    assert np.isnan(vectors[[3, 7]]).all()
    good = np.setdiff1d(np.arange(10), [3, 7])
    np.testing.assert_array_equal(vectors[good], matrix[good].astype(np.float32))
    resumed = list(source.chunks(4, chunks[0].end))
    np.testing.assert_array_equal(np.concatenate([c.vectors for c in resumed]), vectors[4:])


@pytest.mark.parametrize("array, message", [
    (np.zeros(5), "2-D"),
    (np.zeros((3, 2), dtype=np.int64), "floating-point"),
    (np.asfortranarray(np.zeros((3, 2))), "Fortran"),
])
def test_unusable_npy_files_are_refused(tmp_path, array, message):
    np.save(tmp_path / "e.npy", array)
    with pytest.raises(ValueError, match=message):
        EmbeddingFile(tmp_path / "e.npy")


def test_truncated_npy_is_refused(tmp_path):
    np.save(tmp_path / "e.npy", np.zeros((100, 8), dtype=np.float32))
    data = (tmp_path / "e.npy").read_bytes()
    (tmp_path / "e.npy").write_bytes(data[:-10])
    with pytest.raises(ValueError, match="truncated"):
        EmbeddingFile(tmp_path / "e.npy")


def test_parquet_embeddings_reject_wrong_width_null_and_non_finite_vectors(tmp_path):
    vectors = [[1.0, 2.0], [1.0], None, [float("nan"), 1.0], [3.0, 4.0], [5.0, 6.0], [1.0, 2.0, 3.0]]
    ids = ["a", "b", "c", "d", None, "f", "g"]
    pq.write_table(pa.table({"embedding": vectors, "id": ids}), tmp_path / "e.parquet", row_group_size=3)
    source = EmbeddingFile(tmp_path / "e.parquet", id_field="id")
    assert (source.rows, source.dim) == (7, 2)
    chunks = list(source.chunks(3))
    rejects = [(r.row, r.reason) for c in chunks for r in c.rejects]
    assert rejects == [(1, WRONG_WIDTH), (2, MISSING_VECTOR), (3, NON_FINITE), (4, MISSING_ID), (6, WRONG_WIDTH)]
    out = np.concatenate([c.vectors for c in chunks])
    np.testing.assert_array_equal(out[[0, 5]], [[1, 2], [5, 6]])
    assert np.isnan(out[1:5]).all() and np.isnan(out[6]).all()
    assert [i for c in chunks for i in c.ids] == ids
    resumed = list(source.chunks(3, chunks[0].end))
    np.testing.assert_array_equal(np.concatenate([c.vectors for c in resumed]), out[3:])


def test_the_npy_reader_reads_chosen_rows_of_any_numeric_layout(tmp_path):
    for name, array in [("c.npy", np.arange(24.0).reshape(6, 4)),
                        ("f.npy", np.asfortranarray(np.arange(24.0).reshape(6, 4))),
                        ("i.npy", np.arange(24, dtype=np.int32).reshape(6, 4))]:
        np.save(tmp_path / name, array)
        matrix = NpyMatrix(tmp_path / name)
        assert (matrix.rows, matrix.dim, matrix.dtype) == (6, 4, array.dtype)
        np.testing.assert_array_equal(matrix.read(), array)
        np.testing.assert_array_equal(NpyMatrix(tmp_path / name).read([1, 4, 5]), array[[1, 4, 5]])
        assert NpyMatrix(tmp_path / name).read([]).shape == (0, 4)
    np.save(tmp_path / "empty.npy", np.zeros((0, 3), dtype=np.float32))
    assert NpyMatrix(tmp_path / "empty.npy").read().shape == (0, 3)
    assert list(EmbeddingFile(tmp_path / "empty.npy").chunks(4)) == []


@pytest.mark.parametrize("content, message", [
    (b"not an npy file", "not a readable .npy file"),
    (None, r"expected a 2-D \(rows, dim\) array, got shape \(2, 3, 4\)"),
])
def test_the_npy_reader_names_the_file_in_its_errors(tmp_path, content, message):
    path = tmp_path / "e.npy"
    if content is None:
        np.save(path, np.zeros((2, 3, 4)))
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as error:
        NpyMatrix(path)
    assert str(path) in str(error.value)
    with pytest.raises(FileNotFoundError, match="missing.npy"):
        NpyMatrix(tmp_path / "missing.npy").read()
    np.save(tmp_path / "s.npy", np.array([["a", "b"]]))
    with pytest.raises(ValueError, match="expected a numeric array"):
        NpyMatrix(tmp_path / "s.npy")
