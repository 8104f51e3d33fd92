"""The calibration core: values handed over in a batch (a Ray Dataset's column) are checked by
the very rules the file readers apply, `calibrate_chunk` rejects what the calibration maps to
NaN/Inf, and `JobSpec` refuses contradictory jobs before any work."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flowcore.batch.core import (
    InputChangedError,
    JobMismatchError,
    JobSpec,
    calibrate_chunk,
    check_identity,
    chunk_of_values,
)
from flowcore.batch.rows import NON_FINITE_OUTPUT, NOT_A_VECTOR, ZERO_VECTOR, Chunk, Position
from flowcore.batch.text_sources import TextCorpus
from flowcore.batch.vector_sources import EmbeddingFile

DIM = 4
VECTORS = [[0.5, 1.0, -1.0, 2.0], None, [1.0, 2.0, 3.0], [1.0, np.nan, 0.0, 0.0], [1.0, None, 2.0, 3.0],
           [1e39, 0.0, 0.0, 0.0], [3.0e38] * DIM, []]
TEXTS = ["the cat sat", "", "   ", None, 5, "\ud800 dog", "a dog ran", {"nested": 1}]


def as_tuples(rejects):
    return [(reject.row, reject.reason, reject.detail) for reject in rejects]


def test_vectors_in_a_batch_are_rejected_as_the_parquet_reader_rejects_them(tmp_path):
    pq.write_table(pa.table({"embedding": pa.array(VECTORS, pa.list_(pa.float64()))}), tmp_path / "v.parquet")
    read = next(EmbeddingFile(tmp_path / "v.parquet").chunks(100))
    values = np.empty(len(VECTORS), dtype=object)
    values[:] = VECTORS
    handed = chunk_of_values(values, "embedding", DIM)
    assert as_tuples(handed.rejects) == as_tuples(read.rejects)
    assert [reject.row for reject in read.rejects] == [1, 2, 3, 4, 5, 7]
    np.testing.assert_array_equal(handed.vectors, read.vectors)


def test_a_value_that_is_not_a_list_of_numbers_is_a_reject_never_an_error():
    values = np.empty(6, dtype=object)
    values[:] = ["abc", ["a", "b", "c", "d"], [True, False, True, False], [[1.0] * DIM], 7.0, [1.0] * DIM]
    chunk = chunk_of_values(values, "embedding", DIM)
    assert [(reject.row, reject.reason) for reject in chunk.rejects] == [(row, NOT_A_VECTOR) for row in range(5)]
    assert np.isnan(chunk.vectors[:5]).all() and (chunk.vectors[5] == 1.0).all()
    tensor = chunk_of_values(np.ones((3, DIM + 1)), "embedding", DIM)  # a (rows, dim) tensor column of another width
    assert [reject.detail for reject in tensor.rejects] == [f"{DIM + 1} values, expected {DIM}"] * 3


def test_texts_in_a_batch_are_rejected_as_the_jsonl_reader_rejects_them(tmp_path):
    lines = [json.dumps({"text": text}) for text in TEXTS] + [json.dumps({"id": 8})]
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    read = next(TextCorpus(tmp_path / "c.jsonl").chunks(100))
    handed = chunk_of_values(np.array(TEXTS + [float("nan")], dtype=object), "text")  # Ray's null
    assert as_tuples(handed.rejects) == as_tuples(read.rejects)
    assert [reject.row for reject in read.rejects] == [1, 2, 3, 4, 5, 7, 8]
    assert handed.texts == read.texts


def test_rows_the_calibration_maps_to_nan_are_rejected_with_their_counts():
    vectors = np.ones((4, DIM), dtype=np.float32)
    chunk = Chunk(3, 30, 4, Position(34), vectors=vectors)

    def transform(x):
        out = np.array(x, dtype=np.float32)[:, :2] * 2.0  # narrower output than input
        out[x[:, 0] > 1.5] = np.nan
        return out

    vectors[2, 0] = 2.0
    calibrated = calibrate_chunk(chunk, transform, DIM, output_dim=2)
    assert calibrated.vectors.shape == (4, 2) and np.isnan(calibrated.vectors[2]).all()
    assert as_tuples(calibrated.rejects) == [(32, NON_FINITE_OUTPUT, "calibrated, it holds 2 NaN, 0 Inf of 2 values")]
    with pytest.raises(ValueError, match="a text corpus needs an encoder"):
        calibrate_chunk(Chunk(0, 0, 1, Position(1), texts=["a"]), transform, DIM)


def test_normalize_rejects_a_row_calibrated_to_zero_instead_of_writing_it_unnormalized():
    vectors = np.ones((3, DIM), dtype=np.float32) * np.arange(1, 4, dtype=np.float32)[:, None]
    chunk = Chunk(0, 10, 3, Position(13), vectors=vectors)

    def transform(x):  # the second row calibrates to the zero vector
        return np.where(x == 2.0, 0.0, x).astype(np.float32)

    calibrated = calibrate_chunk(chunk, transform, DIM, normalize=True)
    assert as_tuples(calibrated.rejects) == [(11, ZERO_VECTOR, "calibrated, it is the zero vector, which has no "
                                                                "direction to scale to unit length")]
    assert np.isnan(calibrated.vectors[1]).all()
    np.testing.assert_allclose(np.linalg.norm(calibrated.vectors[[0, 2]], axis=1), 1.0, rtol=1e-6)


def test_the_job_spec_refuses_contradictions_before_any_work(tmp_path):
    (tmp_path / "model.flow").write_bytes(b"not read before the arguments are checked")
    flow = tmp_path / "model.flow"
    with pytest.raises(ValueError, match="exactly one of a text corpus"):
        JobSpec(flow)
    with pytest.raises(ValueError, match="exactly one of a text corpus"):
        JobSpec(flow, input="c.txt", embeddings="e.npy")
    with pytest.raises(ValueError, match="--model/--pooling/--quantize apply to text input"):
        JobSpec(flow, embeddings="e.npy", quantize="int8")
    with pytest.raises(ValueError, match="chunk_rows must be at least 1"):
        JobSpec(flow, embeddings="e.npy", chunk_rows=0)
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        JobSpec(flow, embeddings="e.npy", threads=0)
    with pytest.raises(ValueError, match="the vector column needs a non-empty name"):
        JobSpec(flow, embeddings="e.npy", vector_column="")
    spec = JobSpec(flow, input="c.txt", quantize="int8", batch_size=8, threads=1)
    assert (spec.kind, spec.threads, spec.quantize, spec.batch_size, spec.path) == ("text", 1, "int8", 8, "c.txt")


def test_a_text_job_runs_on_every_cpu_it_may_use_unless_told_otherwise(tmp_path, monkeypatch):
    """The encoder does nearly all of a text job's work, so it gets every CPU the process may use (its
    affinity and cgroup quota: `available_cpus`); a Ray actor gets one; `threads` wins."""
    import flowcore.runtime as runtime

    (tmp_path / "model.flow").write_bytes(b"not read before the arguments are checked")
    monkeypatch.setattr(runtime, "available_cpus", lambda: 3)
    assert JobSpec(tmp_path / "model.flow", input="c.txt").threads == 3
    assert JobSpec(tmp_path / "model.flow", input="c.txt", threads=2).threads == 2
    assert JobSpec(tmp_path / "model.flow", input="c.txt", actor=True).threads == 1
    assert JobSpec(tmp_path / "model.flow", embeddings="e.npy", actor=True).threads == 1


def test_a_resume_with_another_thread_count_is_refused_naming_the_one_that_finishes_it(tmp_path):
    recorded = {"input": {"path": "in.txt", "size": 5}, "threads": 2}
    with pytest.raises(JobMismatchError, match=r"\(threads was 2, now 4\); rerun the original command \(with "
                                               r"--threads 2\) to finish it, or add --restart"):
        check_identity(recorded, {**recorded, "threads": 4}, tmp_path / "out.npy.progress.json", "in.txt")


def test_one_identity_check_tells_a_changed_input_from_a_different_job(tmp_path):
    recorded = {"input": {"files": [{"size": 1, "mtime_ns": 5}, {"size": 2, "mtime_ns": 6}]}, "chunk_rows": 40}
    check_identity(recorded, json.loads(json.dumps(recorded)), tmp_path / "job.json", "in/")
    changed = {"input": {"files": [{"size": 1, "mtime_ns": 5}, {"size": 2, "mtime_ns": 7}]}, "chunk_rows": 40}
    with pytest.raises(InputChangedError, match=r"in/ changed since .*\(input.files\[1\].mtime_ns was 6, now 7\)"):
        check_identity(recorded, changed, tmp_path / "job.json", "in/")
    with pytest.raises(JobMismatchError, match=r"records an unfinished run of a different job \(chunk_rows was 40, "
                       r"now 20\); rerun the original command"):
        check_identity(recorded, {**recorded, "chunk_rows": 20}, tmp_path / "job.json", "in/")
