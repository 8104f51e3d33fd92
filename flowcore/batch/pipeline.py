"""The streaming computation: chunks of a source encoded (text) and calibrated in order
(`calibrate_chunks`, `iter_calibrated`), the check that a flow fits its input
(`check_compatible`), and `BackgroundThread`, the one helper that runs a stage of a batch job
(reading, writing) in a thread beside the caller.

Reading runs a bounded number of chunks ahead in a background thread, so memory stays flat and
I/O overlaps compute; rejected rows stay NaN rows of the calibrated chunks.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy as np

from flowcore import defaults
from flowcore._vectors import unit_rows
from flowcore.batch.rows import NON_FINITE_OUTPUT, Chunk, Position, Reject, reject_non_finite
from flowcore.batch.text_sources import TextCorpus
from flowcore.batch.vector_sources import EmbeddingFile

__all__ = [
    "EMBEDDING_CHUNK_BYTES", "QUEUE_DEPTH", "TEXT_CHUNK_ROWS", "BackgroundThread", "CalibratedChunk",
    "calibrate_chunks", "check_compatible", "default_chunk_rows", "encode_with", "iter_calibrated", "normalized",
]

TEXT_CHUNK_ROWS = defaults.TEXT_CHUNK_ROWS
EMBEDDING_CHUNK_BYTES = defaults.EMBEDDING_CHUNK_BYTES
QUEUE_DEPTH = 2

_END = object()


class BackgroundThread:
    """A daemon thread at one end of a bounded queue, the calling thread at the other.

    - `BackgroundThread.reading(items, depth, name)`: the thread iterates `items`, at most
      `depth` items ahead; the caller iterates the `BackgroundThread` to get them.
    - `BackgroundThread.writing(consume, depth, name)`: the caller `put`s items, and the thread
      calls `consume(item)` on each, in order, at most `depth` behind.

    Use it as a context manager. An error raised in the thread is re-raised in the caller: a
    reader's where its next item would have come, a writer's at the caller's next `put` or else
    when it leaves the block. Leaving the block shuts the thread down cleanly, joined before the
    block ends: a reader stops early if the caller did (its iterator is closed in the thread that
    runs it), a writer first consumes every item already put (unless it has failed)."""

    def __init__(self, work: Callable[[], None], depth: int, name: str, reads: bool):
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self._work, self._reads = work, reads
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._caller_left = threading.Event()
        self._thread_left = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @classmethod
    def reading(cls, items: Iterable, depth: int, name: str = "flowcore-reader") -> "BackgroundThread":
        """Iterate `items` in the thread; iterate the result (inside its `with` block) to get them."""
        def produce() -> None:
            iterator = iter(items)
            try:
                for item in iterator:
                    if not pipe._hand_over(item, pipe._caller_left):
                        return
            finally:
                close = getattr(iterator, "close", None)
                if close is not None:
                    close()

        pipe = cls(produce, depth, name, reads=True)
        return pipe

    @classmethod
    def writing(cls, consume: Callable[[object], None], depth: int,
                name: str = "flowcore-writer") -> "BackgroundThread":
        """Call `consume(item)` in the thread for each item the caller `put`s."""
        def drain() -> None:
            while (item := pipe._queue.get()) is not _END:
                consume(item)

        pipe = cls(drain, depth, name, reads=False)
        return pipe

    def _hand_over(self, item, receiver_left: threading.Event) -> bool:
        """Queue `item`, waiting while the queue is full; False (nothing queued) once the
        receiving side has left."""
        while not receiver_left.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            self._work()
        except BaseException as error:  # re-raised in the caller's thread
            self._error = error
        finally:
            if self._reads:
                self._hand_over(_END, self._caller_left)
            self._thread_left.set()

    def __enter__(self) -> "BackgroundThread":
        self._thread.start()
        return self

    def __iter__(self) -> Iterator:
        if not self._reads:
            raise TypeError("a writing BackgroundThread is fed with put(), not iterated")
        while (item := self._queue.get()) is not _END:
            yield item
        self._raise_error()

    def put(self, item) -> None:
        """Hand `item` to the writing thread; raises the thread's error if it has failed."""
        if self._reads:
            raise TypeError("a reading BackgroundThread is iterated, not fed with put()")
        if not self._hand_over(item, self._thread_left):
            self._raise_error()
            raise RuntimeError(f"{self._thread.name} has stopped")

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def __exit__(self, kind, value, traceback) -> None:
        if self._reads:
            self._caller_left.set()
        else:
            self._hand_over(_END, self._thread_left)
        self._thread.join()
        if kind is None and not self._reads:  # a reader's error belongs to an item not asked for
            self._raise_error()


@dataclass
class CalibratedChunk:
    """Rows [row_start, row_start + len(vectors)) calibrated; rejected rows are NaN. `meta`: the
    source chunk's kept columns (see `Chunk`)."""

    index: int
    row_start: int
    vectors: np.ndarray
    ids: list[str | None] | None
    rejects: list[Reject]
    end: Position
    meta: dict | None = None


def default_chunk_rows(source: TextCorpus | EmbeddingFile, dim: int) -> int:
    """Text: chunks of a fixed count of sentences; embeddings: the power of two nearest below
    ~8 MiB of float32 rows."""
    if source.kind == "text":
        return TEXT_CHUNK_ROWS
    rows = max(1, EMBEDDING_CHUNK_BYTES // (4 * dim))
    return 1 << (rows.bit_length() - 1)


def calibrate_chunks(chunks: Iterable[Chunk], transform: Callable[[np.ndarray], np.ndarray], dim: int,
                     encode: Callable[[list[str]], np.ndarray] | None = None,
                     prefetch: int = QUEUE_DEPTH) -> Iterator[CalibratedChunk]:
    """Calibrate reader chunks in order; reading runs up to `prefetch` chunks ahead in a thread.

    `transform` maps finite (n, dim) float32 rows to calibrated rows; `encode` turns the good
    texts of a text chunk into embeddings first. Rejected rows stay NaN."""
    with BackgroundThread.reading(chunks, prefetch) as reader:
        for chunk in reader:
            yield _calibrated(chunk, transform, dim, encode)


def _calibrated(chunk: Chunk, transform, dim: int, encode) -> CalibratedChunk:
    rejects = list(chunk.rejects)
    good = np.ones(chunk.rows, dtype=bool)
    good[[reject.row - chunk.row_start for reject in rejects]] = False
    if chunk.texts is not None:
        if encode is None:
            raise ValueError("a text corpus needs an encoder")
        vectors = np.full((chunk.rows, dim), np.nan, dtype=np.float32)
        if good.any():
            vectors[good] = encode([text for text, keep in zip(chunk.texts, good) if keep])
            rejects += reject_non_finite(vectors, chunk.row_start, good, "the encoder returned NaN/Inf")
    else:
        vectors = chunk.vectors
    if good.all():
        out = np.array(transform(vectors), dtype=np.float32)
    else:
        out = np.full((chunk.rows, dim), np.nan, dtype=np.float32)
        if good.any():
            out[good] = transform(vectors[good])
    rejects += _reject_non_finite_output(out, chunk.row_start, good)
    return CalibratedChunk(chunk.index, chunk.row_start, out, chunk.ids,
                           sorted(rejects, key=lambda reject: reject.row), chunk.end, chunk.meta)


def _reject_non_finite_output(out: np.ndarray, row_start: int, good: np.ndarray) -> list[Reject]:
    """Rows of finite input that the flow (or the normalisation) mapped to NaN/Inf: rejected with
    their counts, never written as if they were results."""
    return [Reject(reject.row, reject.reason, f"the flow returned {reject.detail}")
            for reject in reject_non_finite(out, row_start, good, reason=NON_FINITE_OUTPUT)]


def normalized(transform: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """`transform` followed by `unit_rows`."""
    return lambda vectors: unit_rows(transform(vectors))


def encode_with(encoder, batch_size: int) -> Callable[[list[str]], np.ndarray] | None:
    """The `encode` function of `calibrate_chunks` for an `Encoder` (None for None)."""
    if encoder is None:
        return None
    return lambda texts: encoder.encode(texts, batch_size=batch_size, show_progress_bar=False)


def iter_calibrated(calibrator, source: TextCorpus | EmbeddingFile, encoder=None, chunk_rows: int | None = None,
                    batch_size: int = defaults.BATCH_SIZE, normalize: bool = False) -> Iterator[CalibratedChunk]:
    """Stream a whole source through a fitted `FlowCalibrator` (and `Encoder` for text), one
    `CalibratedChunk` at a time, with reading overlapped with compute; `normalize` scales the
    calibrated rows to unit length (rejected rows stay NaN)."""
    check_compatible(calibrator, source, encoder)
    chunk_rows = chunk_rows or default_chunk_rows(source, calibrator.dim)
    transform = normalized(calibrator.transform) if normalize else calibrator.transform
    return calibrate_chunks(source.chunks(chunk_rows), transform, calibrator.dim, encode_with(encoder, batch_size))


def check_compatible(calibrator, source: TextCorpus | EmbeddingFile, encoder=None,
                     requested_model: str | None = None) -> None:
    """Refuse, before any work, inputs the flow was not fitted for: embeddings of another width,
    or text through another encoder or pooling than the flow's `provenance` records
    (`requested_model`: the name the encoder was asked for, which counts as matching when it is
    the recorded one)."""
    dim = calibrator.dim
    if source.kind == "embeddings":
        if source.dim != dim:
            raise ValueError(f"{source.path} holds {source.dim}-wide vectors but the flow expects {dim}")
        return
    if encoder is None:
        raise ValueError(f"{source.path} is text: an encoder is needed to embed it")
    from flowcore.calibration.flow_file import check_encoder_fits  # torch: only once a flow is in hand

    check_encoder_fits(calibrator.provenance, dim, encoder, requested_model)
