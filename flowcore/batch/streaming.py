"""Streaming, resumable batch calibration of whole corpora or stored embeddings.

A job reads its input a chunk at a time (reader thread), encodes and calibrates the chunk (the
calling thread), and writes it (writer thread); bounded queues between them keep memory flat and
overlap I/O with compute.

Durability: output goes to temporary files beside `OUT` (`OUT.partial`, or one part file per
chunk for parquet), each chunk is fsynced before `OUT.manifest.json` is atomically replaced to
record it as done. Killed at any moment, the same command resumes after the last recorded chunk;
chunk boundaries never move, so the result is byte-identical to an uninterrupted run. The
manifest pins the job (flow file hash, input size and mtime, options): resuming a changed job is
refused. At the end the output is renamed into place and the manifest removed.

Rejected rows go to `OUT.rejects.jsonl` (row, line, reason, detail) and are NaN rows in .npy
output (null vectors in .parquet output).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from flowcore.batch.readers import (
    NON_FINITE, Chunk, EmbeddingFile, Position, Reject, TextCorpus, count_reasons, detect_format,
)

OUTPUT_FORMATS = {".npy": "npy", ".parquet": "parquet"}
MANIFEST_FORMAT = "flowcore-calibrate-manifest"
MANIFEST_VERSION = 1
TEXT_CHUNK_ROWS = 1024
EMBEDDING_CHUNK_BYTES = 8 << 20
QUEUE_DEPTH = 2
# Test hook: seconds each chunk spends in the writer (half before its data is written, half
# before it is recorded as done), so that a test's SIGKILL lands in the middle of a job.
SLOW_CHUNKS_ENV = "_FLOWCORE_TEST_CHUNK_DELAY"


class JobMismatchError(ValueError):
    """A progress manifest exists for a different job than the one requested."""


@dataclass
class CalibratedChunk:
    """Rows [row_start, row_start + len(vectors)) calibrated; rejected rows are NaN."""

    index: int
    row_start: int
    vectors: np.ndarray
    ids: list[str | None] | None
    rejects: list[Reject]
    end: Position


@dataclass
class CalibrationSummary:
    rows: int
    rejects: dict[str, int]
    seconds: float
    rows_this_run: int
    resumed_from: int
    out: Path
    rejects_path: Path

    @property
    def rejected(self) -> int:
        return sum(self.rejects.values())

    @property
    def rows_per_second(self) -> float:
        return self.rows_this_run / self.seconds if self.seconds > 0 else float("inf")

    def __str__(self) -> str:
        reasons = ", ".join(f"{count:,} {reason}" for reason, count in sorted(self.rejects.items()))
        rejected = f"{self.rejected:,} rejected" + (f" ({reasons})" if reasons else "")
        resumed = f", resumed at row {self.resumed_from:,}" if self.resumed_from else ""
        return (f"calibrated {self.rows:,} rows: {self.rows - self.rejected:,} ok, {rejected}{resumed}; "
                f"{self.rows_this_run:,} rows in {self.seconds:.1f} s ({self.rows_per_second:,.0f} rows/s)\n"
                f"output: {self.out}\nrejects: {self.rejects_path}")


def default_chunk_rows(source: TextCorpus | EmbeddingFile, dim: int) -> int:
    """Text: chunks of a fixed count of sentences; embeddings: the power of two nearest below
    ~8 MiB of float32 rows."""
    if source.kind == "text":
        return TEXT_CHUNK_ROWS
    rows = max(1, EMBEDDING_CHUNK_BYTES // (4 * dim))
    return 1 << (rows.bit_length() - 1)


# --------------------------------------------------------------------------------------------
# Streaming computation (the Python iterator API)
# --------------------------------------------------------------------------------------------


def _prefetched(items: Iterable, depth: int) -> Iterator:
    """Iterate `items` in a background thread, at most `depth` items ahead of the consumer."""
    buffer: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    finished = object()

    def offer(entry) -> bool:
        """Queue `entry` unless the consumer has gone; False once it has."""
        while not stop.is_set():
            try:
                buffer.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        iterator = iter(items)
        try:
            for item in iterator:
                if not offer((item, None)):
                    return
            offer((finished, None))
        except BaseException as error:  # handed to the consumer, which re-raises it
            offer((finished, error))
        finally:
            if hasattr(iterator, "close"):
                iterator.close()

    thread = threading.Thread(target=produce, name="flowcore-reader", daemon=True)
    thread.start()
    try:
        while True:
            item, error = buffer.get()
            if item is finished:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        thread.join()


def calibrate_chunks(chunks: Iterable[Chunk], transform: Callable[[np.ndarray], np.ndarray], dim: int,
                     encode: Callable[[list[str]], np.ndarray] | None = None,
                     prefetch: int = QUEUE_DEPTH) -> Iterator[CalibratedChunk]:
    """Calibrate reader chunks in order; reading runs up to `prefetch` chunks ahead in a thread.

    `transform` maps finite (n, dim) float32 rows to calibrated rows; `encode` turns the good
    texts of a text chunk into embeddings first. Rejected rows stay NaN."""
    for chunk in _prefetched(chunks, prefetch):
        rejects = list(chunk.rejects)
        good = np.ones(chunk.rows, dtype=bool)
        good[[reject.row - chunk.row_start for reject in rejects]] = False
        if chunk.texts is not None:
            if encode is None:
                raise ValueError("a text corpus needs an encoder")
            vectors = np.full((chunk.rows, dim), np.nan, dtype=np.float32)
            if good.any():
                vectors[good] = encode([text for text, keep in zip(chunk.texts, good) if keep])
                rejects += _reject_encoder_non_finite(vectors, good, chunk.row_start)
        else:
            vectors = chunk.vectors
        if good.all():
            out = np.asarray(transform(vectors), dtype=np.float32)
        else:
            out = np.full((chunk.rows, dim), np.nan, dtype=np.float32)
            if good.any():
                out[good] = transform(vectors[good])
        yield CalibratedChunk(chunk.index, chunk.row_start, out, chunk.ids,
                              sorted(rejects, key=lambda reject: reject.row), chunk.end)


def _reject_encoder_non_finite(vectors: np.ndarray, good: np.ndarray, row_start: int) -> list[Reject]:
    bad = good & ~np.isfinite(vectors).all(axis=1)
    good &= ~bad
    vectors[bad] = np.nan
    return [Reject(row_start + int(offset), NON_FINITE, "the encoder returned NaN/Inf") for offset in np.flatnonzero(bad)]


def iter_calibrated(calibrator, source: TextCorpus | EmbeddingFile, encoder=None, chunk_rows: int | None = None,
                    batch_size: int = 64) -> Iterator[CalibratedChunk]:
    """Stream a whole source through a fitted `FlowCalibrator` (and `Encoder` for text), one
    `CalibratedChunk` at a time, with reading overlapped with compute."""
    check_compatible(calibrator, source, encoder)
    chunk_rows = chunk_rows or default_chunk_rows(source, calibrator.dim)
    return calibrate_chunks(source.chunks(chunk_rows), calibrator.transform, calibrator.dim,
                            _encode_function(encoder, batch_size))


def _encode_function(encoder, batch_size: int):
    if encoder is None:
        return None
    return lambda texts: encoder.encode(texts, batch_size=batch_size, show_progress_bar=False)


# --------------------------------------------------------------------------------------------
# Compatibility of flow, encoder and input
# --------------------------------------------------------------------------------------------


def check_compatible(calibrator, source: TextCorpus | EmbeddingFile, encoder=None,
                     requested_model: str | None = None) -> None:
    """Refuse, before any work, inputs the flow was not fitted for: embeddings of another width,
    or text through another encoder or pooling than the flow file records (`requested_model`:
    the name the encoder was asked for, which counts as matching when it is the recorded one)."""
    dim = calibrator.dim
    if source.kind == "embeddings":
        if source.dim != dim:
            raise ValueError(f"{source.path} holds {source.dim}-wide vectors but the flow expects {dim}")
        return
    if encoder is None:
        raise ValueError(f"{source.path} is text: an encoder is needed to embed it")
    recorded_model = (calibrator.metadata or {}).get("encoder")
    recorded_pooling = (calibrator.metadata or {}).get("pooling")
    if recorded_model is not None and recorded_model not in (encoder.model_id, requested_model):
        raise ValueError(f"the flow was fitted on embeddings from encoder {recorded_model!r}, "
                         f"not {encoder.model_id!r}; calibrate with the same encoder or refit the flow")
    if recorded_pooling is not None and recorded_pooling != encoder.pooling:
        raise ValueError(f"the flow was fitted on {recorded_pooling!r} pooling, not {encoder.pooling!r}; "
                         "calibrate with the same pooling or refit the flow")
    if encoder.dim != dim:
        raise ValueError(f"encoder {encoder.model_id!r} gives {encoder.dim}-wide vectors but the flow expects {dim}")


# --------------------------------------------------------------------------------------------
# Durable outputs
# --------------------------------------------------------------------------------------------


def _fsync_path(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _write_json_atomically(path: Path, payload: dict) -> None:
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    _fsync_path(path.parent)


def _require_partial(path: Path) -> None:
    if not path.exists():
        raise JobMismatchError(f"{path} is missing, so the unfinished run recorded beside it cannot be "
                               "resumed; rerun with --restart to start over")


class _NpyOutput:
    """One float32 .npy written in place: header first, each chunk at its row's offset."""

    def __init__(self, path: Path, rows: int, dim: int):
        self.path, self.rows, self.dim = path, rows, dim
        self.partial = path.with_name(path.name + ".partial")
        self.handle = None

    def open(self, resume: bool) -> None:
        header = {"descr": np.dtype(np.float32).str, "fortran_order": False, "shape": (self.rows, self.dim)}
        if resume:
            _require_partial(self.partial)
            self.handle = open(self.partial, "r+b")
            np.lib.format.read_magic(self.handle)
            shape, _, _ = np.lib.format.read_array_header_1_0(self.handle)
            self.data_offset = self.handle.tell()
            if shape != (self.rows, self.dim) or os.path.getsize(self.partial) != self.data_offset + self.rows * self.dim * 4:
                raise JobMismatchError(f"{self.partial} does not match its progress manifest; "
                                       "rerun with --restart to start over")
            return
        self.handle = open(self.partial, "w+b")
        np.lib.format.write_array_header_1_0(self.handle, header)
        self.data_offset = self.handle.tell()
        self.handle.truncate(self.data_offset + self.rows * self.dim * 4)
        self.handle.flush()

    def write(self, chunk: CalibratedChunk) -> None:
        data = memoryview(np.ascontiguousarray(chunk.vectors, dtype=np.float32)).cast("B")
        position = self.data_offset + chunk.row_start * self.dim * 4
        while data:
            written = os.pwrite(self.handle.fileno(), data, position)
            data, position = data[written:], position + written

    def sync(self) -> None:
        os.fsync(self.handle.fileno())

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None

    def finish(self, chunks: int) -> None:
        self.close()
        if self.partial.exists():
            _fsync_path(self.partial)
            os.replace(self.partial, self.path)

    def discard(self) -> None:
        self.close()
        self.partial.unlink(missing_ok=True)


class _ParquetOutput:
    """`id` (or row number) plus `embedding` (fixed-size float32 list; null for rejected rows).

    Each chunk is its own durable part file; `finish` joins them, one row group per chunk."""

    def __init__(self, path: Path, rows: int, dim: int, with_ids: bool):
        import pyarrow as pa

        self.path, self.rows, self.dim = path, rows, dim
        self.partial = path.with_name(path.name + ".partial")
        self.parts = path.with_name(path.name + ".parts")
        self.with_ids = with_ids
        self.schema = pa.schema([("id", pa.string() if with_ids else pa.int64()),
                                 ("embedding", pa.list_(pa.float32(), dim))])

    def _part(self, index: int) -> Path:
        return self.parts / f"part-{index:08d}.parquet"

    def open(self, resume: bool) -> None:
        if resume:
            _require_partial(self.parts)
        else:
            shutil.rmtree(self.parts, ignore_errors=True)
        self.parts.mkdir(exist_ok=True)

    def write(self, chunk: CalibratedChunk) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = len(chunk.vectors)
        rejected = np.zeros(rows, dtype=bool)
        rejected[[reject.row - chunk.row_start for reject in chunk.rejects]] = True
        ids = chunk.ids if self.with_ids else np.arange(chunk.row_start, chunk.row_start + rows, dtype=np.int64)
        embedding = pa.FixedSizeListArray.from_arrays(pa.array(chunk.vectors.reshape(-1)), self.dim,
                                                      mask=pa.array(rejected))
        table = pa.Table.from_arrays([pa.array(ids, type=self.schema.field("id").type), embedding], schema=self.schema)
        temporary = self._part(chunk.index).with_suffix(".tmp")
        with open(temporary, "wb") as handle:
            pq.write_table(table, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self._part(chunk.index))

    def sync(self) -> None:
        _fsync_path(self.parts)

    def close(self) -> None:
        pass

    def finish(self, chunks: int) -> None:
        import pyarrow.parquet as pq

        if not self.parts.exists():
            return  # joined and renamed by an earlier run that stopped before cleaning up
        with open(self.partial, "wb") as handle:
            with pq.ParquetWriter(handle, self.schema) as writer:
                for index in range(chunks):
                    writer.write_table(pq.read_table(self._part(index)), row_group_size=max(1, self.rows))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(self.partial, self.path)

    def discard(self) -> None:
        shutil.rmtree(self.parts, ignore_errors=True)
        self.partial.unlink(missing_ok=True)


class _RejectsLog:
    """`OUT.rejects.jsonl`, appended chunk by chunk to a partial file truncated on resume."""

    def __init__(self, path: Path):
        self.path = path
        self.partial = path.with_name(path.name + ".partial")
        self.handle = None

    def open(self, resume_bytes: int | None) -> None:
        if resume_bytes is not None:
            _require_partial(self.partial)
            self.handle = open(self.partial, "r+b")
            self.handle.truncate(resume_bytes)
            self.handle.seek(resume_bytes)
        else:
            self.handle = open(self.partial, "wb")

    def append(self, rejects: list[Reject]) -> int:
        for reject in rejects:
            self.handle.write(json.dumps(reject.to_json(), ensure_ascii=False).encode("utf-8") + b"\n")
        self.handle.flush()
        os.fsync(self.handle.fileno())
        return self.handle.tell()

    def finish(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None
        if self.partial.exists():
            os.replace(self.partial, self.path)

    def discard(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None
        self.partial.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------
# The job
# --------------------------------------------------------------------------------------------


@dataclass
class _Progress:
    """What the manifest records after each completed chunk."""

    rows: int = 0
    offset: int = 0
    line: int = 0
    chunks: int = 0
    rejects_bytes: int = 0
    rejects: dict[str, int] = field(default_factory=dict)

    @property
    def position(self) -> Position:
        return Position(self.rows, self.offset, self.line)


def file_sha256(path: str | os.PathLike) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            sha.update(block)
    return sha.hexdigest()


class CalibrationJob:
    """Calibrate `source` into `out` (.npy or .parquet), resumably; see the module docstring.

    `transform` maps finite float32 (n, dim) rows to calibrated rows, `encode` (text sources)
    maps a list of sentences to embeddings; `pins` (e.g. the flow file hash, the encoder) are
    recorded in the manifest so that resuming a different job is refused. `threads`, when given,
    fixes torch's CPU thread count for the run and is pinned too: float results depend on it."""

    def __init__(self, source: TextCorpus | EmbeddingFile, out: str | os.PathLike,
                 transform: Callable[[np.ndarray], np.ndarray], dim: int,
                 encode: Callable[[list[str]], np.ndarray] | None = None, pins: dict | None = None,
                 chunk_rows: int | None = None, restart: bool = False, progress: bool = True,
                 threads: int | None = None):
        self.source, self.transform, self.dim, self.encode = source, transform, dim, encode
        self.out = Path(out)
        self.format = detect_format(self.out, OUTPUT_FORMATS)
        if self.out.resolve() == Path(source.path).resolve():
            raise ValueError(f"the output {self.out} would overwrite the input")
        if not self.out.parent.is_dir():
            raise FileNotFoundError(f"output folder not found: {self.out.parent}")
        self.chunk_rows = chunk_rows or default_chunk_rows(source, dim)
        if self.chunk_rows < 1:
            raise ValueError(f"chunk_rows must be at least 1, got {self.chunk_rows}")
        self.restart, self.progress = restart, progress
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        self.threads = threads
        self.pins = {**(pins or {}), **({"threads": threads} if threads is not None else {})}
        self.manifest_path = self.out.with_name(self.out.name + ".manifest.json")
        self.rejects_path = self.out.with_name(self.out.name + ".rejects.jsonl")

    # -- manifest ------------------------------------------------------------------------------

    def _job_identity(self) -> dict:
        return {"input": self.source.pin(), "output": {"path": str(self.out.resolve()), "format": self.format},
                "dim": self.dim, "chunk_rows": self.chunk_rows, **self.pins}

    def _load_progress(self, identity: dict) -> tuple[int, _Progress] | None:
        """(rows, progress) of an unfinished earlier run of this same job, or None."""
        if self.restart or not self.manifest_path.exists():
            return None
        try:
            manifest = json.loads(self.manifest_path.read_text(encoding="utf-8"))
            if manifest.get("format") != MANIFEST_FORMAT or manifest.get("version") != MANIFEST_VERSION:
                raise ValueError("unknown manifest format")
            recorded, rows, progress = manifest["job"], manifest["rows"], _Progress(**manifest["done"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise JobMismatchError(f"{self.manifest_path}: unreadable progress manifest ({error}); "
                                   "rerun with --restart to start over") from None
        if recorded != identity:
            changed = _differences(recorded, identity)
            raise JobMismatchError(f"{self.manifest_path} records an unfinished run of a different job "
                                   f"({'; '.join(changed)}); rerun the original command to finish it, "
                                   "or add --restart to start over")
        return rows, progress

    def _commit(self, identity: dict, rows: int, progress: _Progress) -> None:
        _write_json_atomically(self.manifest_path, {
            "format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "job": identity, "rows": rows,
            "done": progress.__dict__})

    # -- running -------------------------------------------------------------------------------

    def run(self) -> CalibrationSummary:
        started = time.perf_counter()
        identity = self._job_identity()
        earlier = self._load_progress(identity)
        rows, progress = earlier if earlier else (self.source.rows, _Progress())
        resumed_from = progress.rows
        output = (_NpyOutput(self.out, rows, self.dim) if self.format == "npy"
                  else _ParquetOutput(self.out, rows, self.dim, with_ids=self.source.id_field is not None))
        rejects = _RejectsLog(self.rejects_path)
        if earlier is None:
            self.manifest_path.unlink(missing_ok=True)
            output.discard()
            rejects.discard()
        total_chunks = -(-rows // self.chunk_rows)
        if earlier is None or progress.chunks < total_chunks:
            output.open(resume=earlier is not None)
            rejects.open(progress.rejects_bytes if earlier is not None else None)
            if earlier is None:
                self._commit(identity, rows, progress)
            try:
                with _torch_threads(self.threads):
                    self._stream(output, rejects, identity, rows, progress)
            finally:
                output.close()
        output.finish(total_chunks)
        rejects.finish()
        _fsync_path(self.out.parent)
        self.manifest_path.unlink(missing_ok=True)
        _fsync_path(self.out.parent)
        output.discard()
        return CalibrationSummary(rows, dict(progress.rejects), time.perf_counter() - started,
                                  rows - resumed_from, resumed_from, self.out, self.rejects_path)

    def _stream(self, output, rejects: _RejectsLog, identity: dict, rows: int, progress: _Progress) -> None:
        from tqdm import tqdm

        delay = float(os.environ.get(SLOW_CHUNKS_ENV, "0") or 0)
        bar = tqdm(total=rows, initial=progress.rows, unit="rows", unit_scale=True, dynamic_ncols=True,
                   disable=not self.progress, file=sys.stderr, desc="calibrate")

        def write(chunk: CalibratedChunk) -> None:
            time.sleep(delay / 2)
            output.write(chunk)
            output.sync()
            rejects_bytes = rejects.append(chunk.rejects)
            time.sleep(delay / 2)
            for reason, count in count_reasons(chunk.rejects).items():
                progress.rejects[reason] = progress.rejects.get(reason, 0) + count
            progress.rows, progress.offset, progress.line = chunk.end.row, chunk.end.offset, chunk.end.line
            progress.chunks, progress.rejects_bytes = chunk.index + 1, rejects_bytes
            self._commit(identity, rows, progress)
            bar.update(len(chunk.vectors))

        chunks = self.source.chunks(self.chunk_rows, progress.position)
        try:
            with _BackgroundConsumer(write, QUEUE_DEPTH, "flowcore-writer") as writer:
                for chunk in calibrate_chunks(chunks, self.transform, self.dim, self.encode):
                    writer.put(chunk)
        finally:
            bar.close()
        if progress.rows != rows:
            raise ValueError(f"{self.source.path} changed while being read: expected {rows} rows, read {progress.rows}")


@contextlib.contextmanager
def _torch_threads(threads: int | None):
    """torch's CPU thread count set to `threads` (None: left alone) for the block."""
    if threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _BackgroundConsumer:
    """Run `consume(item)` for each `put` item in a thread, in order, at most `depth` behind;
    an error in the thread is raised in the producer at its next `put` or at exit."""

    _DONE = object()

    def __init__(self, consume: Callable, depth: int, name: str):
        self.consume = consume
        self.items: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def _loop(self) -> None:
        while (item := self.items.get()) is not self._DONE:
            if self.error is None:
                try:
                    self.consume(item)
                except BaseException as error:  # re-raised in the producer's thread
                    self.error = error

    def put(self, item) -> None:
        while True:
            if self.error is not None:
                raise self.error
            try:
                self.items.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def __enter__(self) -> "_BackgroundConsumer":
        self.thread.start()
        return self

    def __exit__(self, kind, value, traceback) -> None:
        while True:
            try:
                self.items.put(self._DONE, timeout=0.1)
                break
            except queue.Full:
                if not self.thread.is_alive():
                    break
        self.thread.join()
        if self.error is not None and kind is None:
            raise self.error


def _differences(recorded: dict, requested: dict, prefix: str = "") -> list[str]:
    changed = []
    for key in sorted(set(recorded) | set(requested)):
        old, new = recorded.get(key), requested.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            changed += _differences(old, new, f"{prefix}{key}.")
        elif old != new:
            changed.append(f"{prefix}{key} was {old!r}, now {new!r}")
    return changed


# --------------------------------------------------------------------------------------------
# The whole job from files (what `flowcore calibrate` runs)
# --------------------------------------------------------------------------------------------


def calibrate_file(flow_path: str | os.PathLike, out: str | os.PathLike, *, input: str | os.PathLike | None = None,
                   embeddings: str | os.PathLike | None = None, text_field: str = "text", id_field: str | None = None,
                   vector_field: str = "embedding", model: str | None = None, pooling: str | None = None,
                   batch_size: int = 64, chunk_rows: int | None = None, restart: bool = False,
                   progress: bool = True, threads: int | None = None,
                   encoder_factory: Callable | None = None) -> CalibrationSummary:
    """Calibrate a text corpus (`input`) or stored embeddings (`embeddings`) with the flow file
    at `flow_path` into `out`. For text, `model`/`pooling` default to what the flow records;
    anything the flow was not fitted for is refused before work starts.

    `threads` (torch CPU threads, pinned in the manifest because float results depend on it)
    defaults to `default_threads`."""
    from flowcore.calibration.calibrator import FlowCalibrator

    if (input is None) == (embeddings is None):
        raise ValueError("give exactly one of a text corpus (input) or stored embeddings (embeddings)")
    calibrator = FlowCalibrator.load(flow_path)
    pins = {"flow_sha256": file_sha256(flow_path)}
    encoder = None
    if embeddings is not None:
        if model is not None or pooling is not None:
            raise ValueError("--model/--pooling apply to text input, not to stored embeddings")
        source = EmbeddingFile(embeddings, vector_field=vector_field, id_field=id_field)
    else:
        source = TextCorpus(input, text_field=text_field, id_field=id_field)
        requested_model = model or calibrator.metadata.get("encoder")
        if threads is None:
            threads = default_threads(text=True)
        encoder = _encoder_for(calibrator, model, pooling, encoder_factory, threads)
        pins["encoder"] = {"model": encoder.model_id, "pooling": encoder.pooling, "batch_size": batch_size}
    check_compatible(calibrator, source, encoder, requested_model if embeddings is None else None)
    if threads is None:
        threads = default_threads(text=False)
    job = CalibrationJob(source, out, calibrator.transform, calibrator.dim, _encode_function(encoder, batch_size),
                         pins=pins, chunk_rows=chunk_rows, restart=restart, progress=progress, threads=threads)
    return job.run()


def default_threads(text: bool) -> int:
    """torch CPU threads for a job, pinned (float results depend on the count, and a resumed job
    must be byte-identical to an uninterrupted one). Embeddings: one fewer than the CPUs
    available, so that the reader and writer threads keep a core and never deschedule torch's
    threads, which wait for each other at every operator. Text: 1, given to the encoder as a
    fixed count (its load-following default is not reproducible); with 2 pinned threads a
    killed-and-resumed text job was not byte-identical in our tests, so more threads for text
    are an explicit `--threads` choice."""
    import torch

    if text:
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(torch.get_num_threads(), cpus - 1))


def _encoder_for(calibrator, model: str | None, pooling: str | None, encoder_factory: Callable | None,
                 threads: int):
    """The encoder for text input: the flow's recorded one unless overridden (then checked)."""
    recorded_model = (calibrator.metadata or {}).get("encoder")
    recorded_pooling = (calibrator.metadata or {}).get("pooling")
    if recorded_model is None and model is None:
        raise ValueError("the flow file records no encoder (it was fitted on raw embeddings); "
                         "pass --model and --pooling for the encoder that produced them")
    if encoder_factory is None:
        from flowcore import Encoder as encoder_factory
    pooling = pooling or recorded_pooling
    return encoder_factory(model=model or recorded_model, threads=threads, **({"pooling": pooling} if pooling else {}))
