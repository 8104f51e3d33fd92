"""The streaming computation: chunks calibrated in order (`calibrate_chunks`, `iter_calibrated`), read
and written beside the caller by a `BackgroundThread`, so memory stays flat and I/O overlaps compute."""
from __future__ import annotations

import contextlib
import queue
import threading
from typing import Callable, Iterable, Iterator

import numpy as np

from flowcore import defaults
from flowcore.batch.core import calibrate_chunk, check_compatible, default_chunk_rows, encode_with
from flowcore.batch.rows import CalibratedChunk, Chunk
from flowcore.batch.text_sources import TextCorpus
from flowcore.batch.vector_sources import EmbeddingFile

__all__ = ["QUEUE_DEPTH", "BackgroundThread", "calibrate_chunks", "encode_with", "iter_calibrated"]

QUEUE_DEPTH = 2

_END = object()


class BackgroundThread:
    """A daemon thread at one end of a bounded queue (`depth` items), the calling thread at the other, used
    as a context manager: `reading(items, depth)` iterates `items` in the thread for the caller to iterate;
    `writing(consume, depth)` calls `consume(item)` in the thread on each item the caller `put`s, in order.

    An error in the thread is re-raised in the caller: a reader's where its next item would have come, a
    writer's at the next `put` or when the block ends. Leaving the block joins the thread: a reader stops
    early (its iterator closed in its own thread), a writer first consumes every item put (unless it failed)."""

    def __init__(self, work: Callable[["BackgroundThread"], None], depth: int, name: str, reads: bool):
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self._work, self._reads = work, reads
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._caller_left, self._thread_left = threading.Event(), threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @classmethod
    def reading(cls, items: Iterable, depth: int, name: str = "flowcore-reader") -> "BackgroundThread":
        def produce(pipe: BackgroundThread) -> None:
            iterator = iter(items)
            try:
                for item in iterator:
                    if not pipe._hand_over(item, pipe._caller_left):
                        return
            finally:
                getattr(iterator, "close", lambda: None)()  # a generator's cleanup runs in this thread

        return cls(produce, depth, name, reads=True)

    @classmethod
    def writing(cls, consume: Callable[[object], None], depth: int,
                name: str = "flowcore-writer") -> "BackgroundThread":
        def drain(pipe: BackgroundThread) -> None:
            while (item := pipe._queue.get()) is not _END:
                consume(item)

        return cls(drain, depth, name, reads=False)

    def _hand_over(self, item, receiver_left: threading.Event) -> bool:
        """Queue `item`, waiting while the queue is full; False once the receiving side has left."""
        while not receiver_left.is_set():
            with contextlib.suppress(queue.Full):
                self._queue.put(item, timeout=0.1)
                return True
        return False

    def _run(self) -> None:
        try:
            self._work(self)
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


def calibrate_chunks(chunks: Iterable[Chunk], transform: Callable[[np.ndarray], np.ndarray], dim: int,
                     encode: Callable[[list[str]], np.ndarray] | None = None, output_dim: int | None = None,
                     normalize: bool = False) -> Iterator[CalibratedChunk]:
    """`calibrate_chunk` over `chunks` in order, read up to `QUEUE_DEPTH` chunks ahead in a thread."""
    with BackgroundThread.reading(chunks, QUEUE_DEPTH) as reader:
        for chunk in reader:
            yield calibrate_chunk(chunk, transform, dim, encode, output_dim, normalize)


def iter_calibrated(calibrator, source: TextCorpus | EmbeddingFile, encoder=None, chunk_rows: int | None = None,
                    batch_size: int = defaults.BATCH_SIZE, normalize: bool = False) -> Iterator[CalibratedChunk]:
    """Stream a whole source through a fitted calibrator (and `Encoder` for text), one `CalibratedChunk`
    at a time; `normalize` scales the calibrated rows to unit length."""
    check_compatible(calibrator, source, encoder)
    chunk_rows = chunk_rows or default_chunk_rows(source, calibrator.dim)
    return calibrate_chunks(source.chunks(chunk_rows), calibrator.transform, calibrator.dim,
                            encode_with(encoder, batch_size), output_dim=calibrator.output_dim, normalize=normalize)
