"""The streaming pipeline: calibrated chunks match the in-memory flow with bad rows kept in
place, flows refuse inputs they were not fitted for, and `BackgroundThread` hands items over in
order, re-raises the thread's errors in the caller and shuts down cleanly when either side stops."""
import threading
import time

import numpy as np
import pytest

from flowcore import FlowCalibrator
from flowcore.batch.core import check_compatible
from flowcore.batch.pipeline import QUEUE_DEPTH, BackgroundThread, calibrate_chunks, iter_calibrated
from flowcore.batch.rows import Chunk, Position
from flowcore.batch.text_sources import TextCorpus
from flowcore.batch.vector_sources import EmbeddingFile
from flowcore.calibration.file import EncoderProvenance

from helpers.tiny_models import StandInEncoder

DIM = 8


@pytest.fixture(scope="module")
def calibrator():
    """A small flow fitted on random 8-wide vectors."""
    return FlowCalibrator(seed=0).fit(np.random.default_rng(0).normal(size=(256, DIM)).astype(np.float32),
                                      show_progress_bar=False)


def test_iterator_api_streams_calibrated_chunks(tmp_path, calibrator):
    matrix = np.random.default_rng(1).normal(size=(130, DIM)).astype(np.float32)
    matrix[5, 2], matrix[65, 0], matrix[129] = np.nan, np.inf, -np.inf
    np.save(tmp_path / "in.npy", matrix)
    chunks = list(iter_calibrated(calibrator, EmbeddingFile(tmp_path / "in.npy"), chunk_rows=50))
    assert [(c.row_start, len(c.vectors)) for c in chunks] == [(0, 50), (50, 50), (100, 30)]
    assert [r.row for c in chunks for r in c.rejects] == [5, 65, 129]
    np.testing.assert_allclose(chunks[0].vectors[:5], calibrator.transform(matrix[:5]), rtol=1e-5, atol=1e-5)




def reloaded_with(calibrator, provenance, path):
    """A copy of `calibrator` recording `provenance`, through a flow file."""
    calibrator.save(path)
    copy = FlowCalibrator.load(path)
    copy.provenance = provenance
    copy.save(path)
    return FlowCalibrator.load(path)


def test_check_compatible_reads_the_flows_provenance(tmp_path, calibrator):
    (tmp_path / "c.txt").write_text("one\n")
    corpus = TextCorpus(tmp_path / "c.txt")
    fitted = reloaded_with(calibrator, EncoderProvenance("stand-in", "mean"), tmp_path / "text.flow")
    assert fitted.provenance == EncoderProvenance("stand-in", "mean")
    check_compatible(fitted, corpus, StandInEncoder())
    with pytest.raises(ValueError, match="fitted on embeddings from encoder 'stand-in', not 'other'"):
        check_compatible(fitted, corpus, StandInEncoder(model="other"))
    with pytest.raises(ValueError, match="fitted on 'mean' pooling, not 'cls'"):
        check_compatible(fitted, corpus, StandInEncoder(pooling="cls"))
    with pytest.raises(ValueError, match="gives 9-wide vectors but the flow calibrator expects 8"):
        check_compatible(fitted, corpus, StandInEncoder(dim=DIM + 1))
    with pytest.raises(ValueError, match="an encoder is needed"):
        check_compatible(fitted, corpus)
    unknown = reloaded_with(calibrator, None, tmp_path / "raw.flow")
    check_compatible(unknown, corpus, StandInEncoder(model="any", pooling="cls"))  # nothing recorded to contradict


def test_the_encoder_a_job_loads_may_name_its_model_by_the_name_the_calibrator_records(tmp_path, calibrator,
                                                                                        monkeypatch):
    """A model found at a path (its `model_id`) still fits a calibrator that records the name it was asked by."""
    import flowcore.text.encoder
    from flowcore.batch.core import load_encoder

    class FoundAtAPath(StandInEncoder):
        def __init__(self, model, pooling, **options):
            super().__init__(model=f"/models/{model}", pooling=pooling)

    monkeypatch.setattr(flowcore.text.encoder, "Encoder", FoundAtAPath)
    fitted = reloaded_with(calibrator, EncoderProvenance("stand-in", "mean"), tmp_path / "text.flow")
    assert load_encoder(fitted).model_id == "/models/stand-in"
    with pytest.raises(ValueError, match="fitted on embeddings from encoder 'stand-in', not '/models/other'"):
        load_encoder(fitted, model="other")


def embedding_chunks(count: int, rows: int = 3, log: list | None = None):
    """`count` chunks of `rows` finite rows; appends to `log` what happened, from which thread."""
    try:
        for index in range(count):
            if log is not None:
                log.append(("read", index))
            vectors = np.full((rows, DIM), float(index), dtype=np.float32)
            yield Chunk(index, index * rows, rows, Position((index + 1) * rows), vectors=vectors)
    finally:
        if log is not None:
            log.append(("closed", threading.current_thread().name))


def test_calibrate_chunks_stopped_early_closes_its_reader_in_the_reader_thread():
    log = []
    calibrated = calibrate_chunks(embedding_chunks(10**6, log=log), lambda x: x + 1.0, DIM)
    first = next(calibrated)
    np.testing.assert_array_equal(first.vectors, np.ones((3, DIM)))
    calibrated.close()
    assert log[-1] == ("closed", "flowcore-reader")
    assert len(log) - 1 <= 1 + QUEUE_DEPTH + 1  # the chunk taken, the queue's, and one in the reader's hands
    assert not any(thread.name == "flowcore-reader" for thread in threading.enumerate())


def test_reading_hands_items_over_in_order_at_most_depth_ahead():
    produced = []

    def items():
        for index in range(20):
            produced.append(index)
            yield index

    got = []
    with BackgroundThread.reading(items(), depth=3) as reader:
        for item in reader:
            time.sleep(0.002)
            assert len(produced) <= item + 1 + 3 + 1
            got.append(item)
    assert got == list(range(20))


class Broken(Exception):
    pass


def test_reading_errors_are_raised_in_the_caller_after_the_items_before_them():
    def items():
        yield from (1, 2)
        raise Broken("disk gone")

    got = []
    with pytest.raises(Broken, match="disk gone"):
        with BackgroundThread.reading(items(), depth=1) as reader:
            for item in reader:
                got.append(item)
    assert got == [1, 2]


def test_reading_stopped_early_closes_the_iterator_and_joins_the_thread():
    log = []
    with BackgroundThread.reading(embedding_chunks(10**6, log=log), depth=2, name="test-reader") as reader:
        for chunk in reader:
            if chunk.index == 1:
                break
    assert log[-1] == ("closed", "test-reader")
    assert not any(thread.name == "test-reader" for thread in threading.enumerate())


def test_writing_consumes_in_order_in_its_thread_and_finishes_everything_put():
    consumed = []

    def consume(item):
        time.sleep(0.005)
        consumed.append((item, threading.current_thread().name))

    with BackgroundThread.writing(consume, depth=2, name="test-writer") as writer:
        for item in range(10):
            writer.put(item)
    assert consumed == [(item, "test-writer") for item in range(10)]
    with pytest.raises(KeyError):  # the caller's own error wins; what was put is still consumed
        with BackgroundThread.writing(consume, depth=2) as writer:
            writer.put("last")
            raise KeyError("caller")
    assert consumed[-1][0] == "last"


def test_writing_errors_are_raised_at_the_next_put_or_on_leaving_the_block():
    def consume(item):
        if item == 3:
            raise Broken(f"cannot write {item}")

    put = []
    with pytest.raises(Broken, match="cannot write 3"):
        with BackgroundThread.writing(consume, depth=1) as writer:
            for item in range(10**6):
                writer.put(item)
                put.append(item)
    assert 3 <= put[-1] < 3 + 1 + 2 + 1  # stopped within the queue's reach of the failure
    with pytest.raises(Broken, match="cannot write 3"):
        with BackgroundThread.writing(consume, depth=5) as writer:
            writer.put(3)  # fails in the thread after this returned
    assert not any(thread.name == "flowcore-writer" for thread in threading.enumerate())


def test_each_direction_refuses_the_other_ones_calls():
    with BackgroundThread.writing(print, depth=1) as writer:
        with pytest.raises(TypeError, match="put"):
            iter(writer).__next__()
    with BackgroundThread.reading([1], depth=1) as reader:
        with pytest.raises(TypeError, match="iterated"):
            reader.put(1)
        assert list(reader) == [1]
    with pytest.raises(ValueError, match="depth"):
        BackgroundThread.reading([], depth=0)
