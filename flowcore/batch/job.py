"""The resumable calibration job behind `flowcore calibrate`: `CalibrationJob` (a source into one
.npy or .parquet file), its progress file and its manifest, `CalibrationSummary`, and
`calibrate_file` (the whole job from a flow file and an input path).

A job reads its input a chunk at a time (reader thread), encodes and calibrates the chunk (the
calling thread), and writes it (writer thread); bounded queues between them keep memory flat and
overlap I/O with compute.

Durability: output goes to temporary files beside `OUT` (`OUT.partial`, or one part file per
chunk for parquet), each chunk is fsynced before the progress file `OUT.progress.json` is
atomically replaced to record it as done. Killed at any moment, the same command resumes after
the last recorded chunk; chunk boundaries never move, so the result is byte-identical to an
uninterrupted run. The progress file records the job's identity (flow file hash, input size and
mtime, options): resuming a changed job is refused. At the end the output is renamed into place,
its manifest `OUT.manifest.json` (what the vectors are and where they came from:
`MANIFEST_FORMAT`) is written atomically, and the progress file is removed; a job killed while
finishing completes on the next run.

Rejected rows go to `OUT.rejects.jsonl` (row, line, reason, detail) and are NaN rows in .npy
output (null vectors in .parquet output); so are rows the flow maps to NaN/Inf.

Faults (docs/faults.md): one job at a time holds `OUT.lock` (`flowcore.batch.lock`), a second is
refused naming the holder; SIGINT/SIGTERM stop the job at a chunk boundary with `JobInterrupted`
(`flowcore.batch.interrupts`); a write that fails (full disk, read-only or vanished folder) is an
`OutputWriteError` naming the path and the bytes needed; an input that changes while the job
runs stops it (`InputChangedError`), and one changed between runs is refused on resume.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from flowcore import defaults
from flowcore._fs import (
    OutputWriteError,
    atomic_write_json,
    file_sha256,
    free_bytes,
    fsync,
    remove_temporaries,
    write_error,
)
from flowcore.batch.interrupts import JobInterrupted, StopSignals
from flowcore.batch.lock import OutputLock, OutputLockedError
from flowcore.batch.outputs import VECTOR_COLUMN, JobMismatchError, RejectsLog, open_output
from flowcore.batch.pipeline import (
    QUEUE_DEPTH,
    BackgroundThread,
    CalibratedChunk,
    calibrate_chunks,
    check_compatible,
    default_chunk_rows,
    encode_with,
    normalized,
)
from flowcore.batch.rows import Position, count_reasons, detect_format, file_changed
from flowcore.batch.text_sources import TextCorpus
from flowcore.batch.vector_sources import EmbeddingFile
from flowcore.runtime import check_threads, job_threads, pinned_threads

__all__ = [
    "MANIFEST_FORMAT", "MANIFEST_VERSION", "OUTPUT_FORMATS", "PROGRESS_FORMAT", "PROGRESS_VERSION", "STAGES",
    "CalibrationJob", "CalibrationSummary", "ChunkHook", "InputChangedError", "JobInterrupted", "JobMismatchError",
    "OutputLockedError", "OutputWriteError", "arrow_type_name", "calibrate_file", "default_threads", "encoder_for",
]

OUTPUT_FORMATS = {".npy": "npy", ".parquet": "parquet"}
PROGRESS_FORMAT = "flowcore-calibrate-progress"
PROGRESS_VERSION = 2
"""`OUT.progress.json`, an unfinished job's record. Version 1 was called `OUT.manifest.json`
(format "flowcore-calibrate-manifest"); such a file left by an earlier flowcore is refused
(finish it with that version, or --restart)."""
MANIFEST_FORMAT = "flowcore-vectors-manifest"
MANIFEST_VERSION = 1
"""`OUT.manifest.json`, the description of a finished output (see `CalibrationJob.manifest`)."""
_LEGACY_PROGRESS_FORMAT = "flowcore-calibrate-manifest"

STAGES = ("writing", "written", "committed")
"""The stages at which a job calls its `on_chunk` hook for each chunk, in this order: before the
chunk's data is written; after its data and rejects are durable but before the manifest records
it; after the progress file records it as done."""

ChunkHook = Callable[[str, CalibratedChunk], None]

RESUME_ADVICE = "the progress file records only the chunks completed before it; fix this and rerun the same command"


class InputChangedError(JobMismatchError):
    """The input changed while a job read it (appended, truncated, replaced, rewritten)."""


@contextlib.contextmanager
def _writing(path: Path, needed: int | None = None, advice: str = RESUME_ADVICE):
    """Turn an OSError raised inside the block while writing `path` into a one-line
    `OutputWriteError` (`flowcore._fs.write_error`)."""
    try:
        yield
    except OSError as error:
        raise write_error(error, path, needed, advice) from None


@dataclass
class CalibrationSummary:
    """What a finished job did: all rows and rejects, and what this run (after a resume) added."""

    rows: int
    rejects: dict[str, int]
    seconds: float
    rows_this_run: int
    resumed_from: int
    out: Path
    rejects_path: Path
    manifest_path: Path | None = None
    lock_taken_over: dict | None = None
    """The holder record of a killed job whose lock file this run took over, if any."""

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
        stale = self.lock_taken_over
        took_over = (f"\ntook over the lock of a job that is no longer running (pid {stale.get('pid')} on "
                     f"{stale.get('host')}, started {stale.get('started')})" if stale else "")
        return (f"calibrated {self.rows:,} rows: {self.rows - self.rejected:,} ok, {rejected}{resumed}; "
                f"{self.rows_this_run:,} rows in {self.seconds:.1f} s ({self.rows_per_second:,.0f} rows/s)\n"
                f"output: {self.out}\nrejects: {self.rejects_path}"
                + (f"\nmanifest: {self.manifest_path}" if self.manifest_path else "") + took_over)


# --------------------------------------------------------------------------------------------
# The progress file
# --------------------------------------------------------------------------------------------


@dataclass
class _Progress:
    """What the progress file records after each completed chunk."""

    rows: int = 0
    offset: int = 0
    line: int = 0
    chunks: int = 0
    rejects_bytes: int = 0
    rejects: dict[str, int] = field(default_factory=dict)

    @property
    def position(self) -> Position:
        return Position(self.rows, self.offset, self.line)


class _ProgressFile:
    """`OUT.progress.json`: the job's identity, its row count and its `_Progress`, replaced
    atomically after each chunk."""

    def __init__(self, path: Path, identity: dict):
        self.path, self.identity = path, identity

    def load(self) -> tuple[int, _Progress] | None:
        """(rows, progress) of an unfinished earlier run of this same job, or None if there is none."""
        if not self.path.exists():
            return None
        try:
            record = json.loads(self.path.read_text(encoding="utf-8"))
            if record.get("format") != PROGRESS_FORMAT or record.get("version") != PROGRESS_VERSION:
                raise ValueError("unknown progress file format")
            recorded, rows, progress = record["job"], record["rows"], _Progress(**record["done"])
            if not isinstance(recorded, dict) or not isinstance(rows, int):
                raise ValueError("no job identity or row count")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise JobMismatchError(f"{self.path}: unreadable progress file ({error}); "
                                   "rerun with --restart to start over") from None
        if isinstance(recorded.get("input"), dict) and "fingerprint" not in recorded["input"]:
            # written before inputs were fingerprinted: resumable on size and mtime alone
            requested = {**self.identity, "input": {key: value for key, value in self.identity["input"].items()
                                                    if key != "fingerprint"}}
            if recorded == requested:
                return rows, progress
        if recorded != self.identity:
            changed = _differences(recorded, self.identity)
            if all(change.startswith("input.") for change in changed):
                raise InputChangedError(f"{self.identity['input']['path']} changed since the unfinished run that "
                                        f"{self.path} records ({'; '.join(changed)}): the rows done so far came "
                                        "from its old content; restore it, or add --restart to start over")
            raise JobMismatchError(f"{self.path} records an unfinished run of a different job "
                                   f"({'; '.join(changed)}); rerun the original command to finish it, "
                                   "or add --restart to start over")
        return rows, progress

    def commit(self, rows: int, progress: _Progress) -> None:
        atomic_write_json(self.path, {"format": PROGRESS_FORMAT, "version": PROGRESS_VERSION, "job": self.identity,
                                      "rows": rows, "done": progress.__dict__}, indent=1, sort_keys=True)


def _refuse_legacy_progress(manifest_path: Path) -> None:
    """An `OUT.manifest.json` that is an earlier flowcore's progress record (format version 1)
    belongs to an unfinished run this version cannot resume."""
    try:
        legacy = json.loads(manifest_path.read_text(encoding="utf-8")).get("format") == _LEGACY_PROGRESS_FORMAT
    except (OSError, ValueError, AttributeError):
        return
    if legacy:
        raise JobMismatchError(f"{manifest_path} records an unfinished run of an earlier flowcore (progress now "
                               f"goes to {manifest_path.name.removesuffix('.manifest.json')}.progress.json); finish "
                               "it with that version, or rerun with --restart to start over")


def _remove_legacy_progress(manifest_path: Path) -> None:
    """--restart: an earlier flowcore's progress record in `OUT.manifest.json` describes nothing."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        if json.loads(manifest_path.read_text(encoding="utf-8")).get("format") == _LEGACY_PROGRESS_FORMAT:
            manifest_path.unlink()


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
# The job
# --------------------------------------------------------------------------------------------


class CalibrationJob:
    """Calibrate `source` into `out` (.npy or .parquet), resumably; see the module docstring.

    Args:
        source: a `TextCorpus` or `EmbeddingFile`; its `keep_columns` become parquet columns.
        out: the output file, .npy (float32, row i = input row i) or .parquet (`id`, the vector
            column, the kept columns).
        transform: maps finite float32 (n, dim) rows to calibrated rows.
        dim: the width of the vectors `transform` takes.
        encode: (text sources) maps a list of sentences to (n, dim) embeddings.
        identity: more entries of the job's identity (e.g. the flow file hash, the encoder),
            recorded in the progress file so that resuming a different job is refused.
        normalize: scale each calibrated row to unit length (rejected rows stay NaN/null);
            part of the identity.
        vector_column: the parquet vector column's name (default "embedding"); part of the identity.
        description: more entries of the finished output's manifest (`manifest`), e.g. the
            encoder and the calibration that made the vectors.
        chunk_rows: rows per chunk, the resume granularity (default: `default_chunk_rows`).
        restart: ignore an unfinished earlier run and start over.
        progress: show a progress bar on stderr.
        threads: when given, fixes torch's CPU thread count for the run; part of the identity,
            since float results depend on it.
        on_chunk: `on_chunk(stage, chunk)` is called in the writer thread at each of `STAGES`
            of every chunk: a hook for progress reporting or fault injection (an error it
            raises stops the job as a failed write would; "written" is the point between a
            chunk's durable data and its record in the manifest).
        handle_signals: (main thread only) the first SIGINT/SIGTERM stops the job at the next
            chunk boundary with `JobInterrupted`, a second exits at once (`StopSignals`).

    Example:
        >>> source = EmbeddingFile("emb.npy")
        >>> CalibrationJob(source, "out.npy", calibrator.transform, source.dim).run()
    """

    def __init__(self, source: TextCorpus | EmbeddingFile, out: str | os.PathLike,
                 transform: Callable[[np.ndarray], np.ndarray], dim: int,
                 encode: Callable[[list[str]], np.ndarray] | None = None, identity: dict | None = None,
                 chunk_rows: int | None = None, restart: bool = False, progress: bool = True,
                 threads: int | None = None, on_chunk: ChunkHook | None = None, normalize: bool = False,
                 vector_column: str | None = None, description: dict | None = None, handle_signals: bool = True):
        self.source, self.dim, self.encode = source, dim, encode
        self.normalize = bool(normalize)
        self.transform = normalized(transform) if self.normalize else transform
        self.out = Path(out)
        self.format = detect_format(self.out, OUTPUT_FORMATS)
        self.keep_columns = tuple(getattr(source, "keep_columns", ()))
        _check_output_options(self.out, self.keep_columns, vector_column)
        self.vector_column = (vector_column or VECTOR_COLUMN) if self.format == "parquet" else None
        self.description = dict(description or {})
        if self.out.resolve() == Path(source.path).resolve():
            raise ValueError(f"the output {self.out} would overwrite the input")
        if not self.out.parent.is_dir():
            raise FileNotFoundError(f"output folder not found: {self.out.parent}")
        self.chunk_rows = chunk_rows or default_chunk_rows(source, dim)
        if self.chunk_rows < 1:
            raise ValueError(f"chunk_rows must be at least 1, got {self.chunk_rows}")
        self.restart, self.progress, self.on_chunk = restart, progress, on_chunk
        self.handle_signals = handle_signals
        self.threads = check_threads(threads)
        self._identity = {**(identity or {}), **({"threads": threads} if threads is not None else {})}
        self.progress_path = self.out.with_name(self.out.name + ".progress.json")
        self.manifest_path = self.out.with_name(self.out.name + ".manifest.json")
        self.rejects_path = self.out.with_name(self.out.name + ".rejects.jsonl")

    def identity(self) -> dict:
        """What the progress file records as this job: input, output, width, chunking,
        normalisation, and the extra `identity` entries (and `threads`) given."""
        return {"input": self.source.identity(),
                "output": {"path": str(self.out.resolve()), "format": self.format, "vector_column": self.vector_column},
                "dim": self.dim, "chunk_rows": self.chunk_rows, "normalize": self.normalize, **self._identity}

    def run(self) -> CalibrationSummary:
        """Run (or resume) the job; see the class and module docstrings.

        Returns:
            the `CalibrationSummary`. Raises `OutputLockedError` while another job writes `out`,
            `JobInterrupted` when stopped by a signal, `OutputWriteError` when a write fails,
            `JobMismatchError`/`InputChangedError` when an unfinished run cannot be resumed.
        """
        started = time.perf_counter()
        if not self.out.parent.is_dir():
            raise FileNotFoundError(f"output folder not found: {self.out.parent}")
        lock = OutputLock(self.out)
        with _writing(lock.path, advice="choose a writable output folder"):
            lock.acquire()
        try:
            with StopSignals(self.handle_signals) as stop:
                summary = self._run(started, stop)
        finally:
            lock.release()
        summary.lock_taken_over = lock.took_over
        return summary

    def _run(self, started: float, stop: StopSignals) -> CalibrationSummary:
        identity = self.identity()
        record = _ProgressFile(self.progress_path, identity)
        earlier = None if self.restart else record.load()
        if earlier is None and not self.restart:
            _refuse_legacy_progress(self.manifest_path)
        rows, progress = earlier if earlier else (self.source.rows, _Progress())
        resumed_from = progress.rows
        output = open_output(self.out, self.format, rows, self.dim, with_ids=self.source.id_field is not None,
                             vector_column=self.vector_column or VECTOR_COLUMN, meta_types=self._meta_types())
        rejects = RejectsLog(self.rejects_path)
        if earlier is None:
            with _writing(self.progress_path):
                self.progress_path.unlink(missing_ok=True)
                if self.restart:
                    _remove_legacy_progress(self.manifest_path)
                output.discard()
                rejects.discard()
        total_chunks = -(-rows // self.chunk_rows)
        if earlier is None or progress.chunks < total_chunks:
            if earlier is None:
                _check_space(output.chunk_path(0), output.bytes_needed())
            try:
                with _writing(output.chunk_path(0), output.bytes_needed() if earlier is None else None):
                    output.open(resume=earlier is not None)
                    rejects.open(progress.rejects_bytes if earlier is not None else None)
                    if earlier is None:
                        record.commit(rows, progress)
                with pinned_threads(self.threads):
                    self._stream(output, rejects, record, rows, progress, stop, identity["input"])
            finally:
                output.close()
                rejects.close()
            if stop.requested and progress.chunks < total_chunks:  # stopped at a chunk boundary
                raise JobInterrupted(progress.rows, stop.signum)
        with _writing(self.out):
            output.finish(total_chunks)
            rejects.finish()
            fsync(self.out.parent)
            atomic_write_json(self.manifest_path, self.manifest(rows, progress.rejects), indent=1)
            remove_temporaries(self.manifest_path)  # a manifest write cut short by a kill
            self.progress_path.unlink(missing_ok=True)
            remove_temporaries(self.progress_path)  # a progress write cut short by a kill
            fsync(self.out.parent)
            output.discard()
        return CalibrationSummary(rows, dict(progress.rejects), time.perf_counter() - started,
                                  rows - resumed_from, resumed_from, self.out, self.rejects_path, self.manifest_path)

    def _meta_types(self) -> list:
        return list(self.source.meta_types()) if self.keep_columns else []

    def manifest(self, rows: int, rejects: dict[str, int]) -> dict:
        """`OUT.manifest.json` of the finished output: what its rows are (count, rejects, width,
        dtype, normalisation, columns), where they came from (input, and the `description`
        entries: encoder, calibration) and the format versions involved."""
        import flowcore

        rejected = sum(rejects.values())
        parquet = self.format == "parquet"
        description = {key: value for key, value in self.description.items() if key != "format_versions"}
        id_type = "string" if self.source.id_field is not None else "int64"
        if parquet:
            import pyarrow.parquet as pq

            schema = pq.read_schema(self.out)
            columns = [{"name": field.name, "type": arrow_type_name(field.type)} for field in schema]
            versions = {"parquet": pq.ParquetFile(self.out).metadata.format_version}
        else:
            columns, versions = None, {"npy": "1.0"}
        return {
            "format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "flowcore_version": flowcore.__version__,
            "file": self.out.name, "file_format": self.format,
            "rows": rows, "ok": rows - rejected, "rejected": rejected, "rejects": dict(sorted(rejects.items())),
            "rejects_file": self.rejects_path.name,
            "dim": self.dim, "dtype": "float32", "normalized": self.normalize,
            "rejected_rows": "null vector" if parquet else "NaN row",
            "id_column": "id" if parquet else None,
            "id_type": (id_type if parquet else None),
            "id_source": self.source.id_field if self.source.id_field is not None else "row number",
            "vector_column": self.vector_column, "columns": columns, "kept_columns": list(self.keep_columns),
            "input": {"kind": self.source.kind, **self.source.identity()},
            **description,
            "threads": self.threads, "chunk_rows": self.chunk_rows,
            "format_versions": {"manifest": MANIFEST_VERSION, "progress": PROGRESS_VERSION,
                                **self.description.get("format_versions", {}), **versions},
        }

    def _stream(self, output, rejects: RejectsLog, record: _ProgressFile, rows: int, progress: _Progress,
                stop: StopSignals, input_identity: dict) -> None:
        from tqdm import tqdm

        on_chunk = self.on_chunk or (lambda stage, chunk: None)
        bar = tqdm(total=rows, initial=progress.rows, unit="rows", unit_scale=True, dynamic_ncols=True,
                   disable=not self.progress, file=sys.stderr, desc="calibrate")

        def write(chunk: CalibratedChunk) -> None:
            if stop.requested:  # chunks read ahead of a stop are dropped, to be redone on resume
                return
            changed = file_changed(input_identity)
            if changed is not None or chunk.end.row > rows:
                raise InputChangedError(f"{self.source.path} changed while the job read it "
                                        f"({changed or f'it now has more than {rows:,} rows'}); the output so far "
                                        "is kept as it was, and a rerun is refused: add --restart to start over")
            on_chunk("writing", chunk)
            with _writing(output.chunk_path(chunk.index), chunk.vectors.nbytes):
                output.write(chunk)
                output.sync()
            with _writing(rejects.partial):
                rejects_bytes = rejects.append(chunk.rejects)
            on_chunk("written", chunk)
            for reason, count in count_reasons(chunk.rejects).items():
                progress.rejects[reason] = progress.rejects.get(reason, 0) + count
            progress.rows, progress.offset, progress.line = chunk.end.row, chunk.end.offset, chunk.end.line
            progress.chunks, progress.rejects_bytes = chunk.index + 1, rejects_bytes
            with _writing(record.path):
                record.commit(rows, progress)
            bar.update(len(chunk.vectors))
            on_chunk("committed", chunk)

        chunks = self.source.chunks(self.chunk_rows, progress.position)
        try:
            with BackgroundThread.writing(write, QUEUE_DEPTH) as writer, \
                    contextlib.closing(calibrate_chunks(chunks, self.transform, self.dim, self.encode)) as calibrated:
                for chunk in calibrated:
                    if stop.requested:
                        break
                    writer.put(chunk)
        finally:
            bar.close()
        if progress.rows != rows and not stop.requested:
            raise InputChangedError(f"{self.source.path} changed while the job read it: expected {rows:,} rows, "
                                    f"read {progress.rows:,}; add --restart to start over")


def _check_space(path: Path, needed: int | None) -> None:
    """Refuse before any work an output whose file system cannot hold it (`needed` bytes)."""
    free = free_bytes(path.parent)
    if needed is not None and free is not None and free < needed:
        raise OutputWriteError(f"cannot write {path}: it needs {needed:,} bytes and only {free:,} are free on its "
                               "file system; free some space or choose another --out")


# --------------------------------------------------------------------------------------------
# The whole job from files (what `flowcore calibrate` runs)
# --------------------------------------------------------------------------------------------


def calibrate_file(flow_path: str | os.PathLike, out: str | os.PathLike, *, input: str | os.PathLike | None = None,
                   embeddings: str | os.PathLike | None = None, text_field: str = "text", id_field: str | None = None,
                   vector_field: str = "embedding", model: str | None = None, pooling: str | None = None,
                   batch_size: int = defaults.BATCH_SIZE, chunk_rows: int | None = None, restart: bool = False,
                   progress: bool = True, threads: int | None = None, encoder_factory: Callable | None = None,
                   on_chunk: ChunkHook | None = None, keep_columns=(), vector_column: str | None = None,
                   normalize: bool = False) -> CalibrationSummary:
    """Calibrate a text corpus (`input`) or stored embeddings (`embeddings`) with the flow file
    at `flow_path` into `out`, and describe the result in `OUT.manifest.json`. For text,
    `model`/`pooling` default to what the flow records; anything the flow was not fitted for is
    refused before work starts.

    `threads` (torch CPU threads, part of the job's identity because float results depend on
    it) defaults to `default_threads`; `on_chunk` is `CalibrationJob`'s hook; `keep_columns`
    (input columns passed through), `vector_column` (default "embedding") and `normalize`
    (unit-length rows) are `CalibrationJob`'s, the first two for .parquet output only."""
    from flowcore.calibration.calibrator import FlowCalibrator

    if (input is None) == (embeddings is None):
        raise ValueError("give exactly one of a text corpus (input) or stored embeddings (embeddings)")
    _check_output_options(Path(out), keep_columns, vector_column)
    calibrator = FlowCalibrator.load(flow_path)
    identity = {"flow_sha256": file_sha256(flow_path)}
    encoder = requested_model = None
    if embeddings is not None:
        if model is not None or pooling is not None:
            raise ValueError("--model/--pooling apply to text input, not to stored embeddings")
        source = EmbeddingFile(embeddings, vector_field=vector_field, id_field=id_field, keep_columns=keep_columns)
    else:
        source = TextCorpus(input, text_field=text_field, id_field=id_field, keep_columns=keep_columns)
        requested_model = model or (calibrator.provenance.model if calibrator.provenance is not None else None)
        if threads is None:
            threads = default_threads(text=True)
        encoder = encoder_for(calibrator, model, pooling, encoder_factory, threads)
        identity["encoder"] = {"model": encoder.model_id, "pooling": encoder.pooling, "batch_size": batch_size}
        if getattr(encoder, "quantize", None) is not None:  # int8 rows never resume a float32 run, nor the reverse
            identity["encoder"]["quantize"] = encoder.quantize
    check_compatible(calibrator, source, encoder, requested_model)
    if threads is None:
        threads = default_threads(text=False)
    description = _describe(flow_path, identity["flow_sha256"], calibrator, encoder, batch_size)
    job = CalibrationJob(source, out, calibrator.transform, calibrator.dim, encode_with(encoder, batch_size),
                         identity=identity, chunk_rows=chunk_rows, restart=restart, progress=progress,
                         threads=threads, on_chunk=on_chunk, normalize=normalize, vector_column=vector_column,
                         description=description)
    return job.run()


def arrow_type_name(kind) -> str:
    """A pyarrow type as the manifest names it: floats by width (float32), lists without their
    child field's name (which parquet readers rename), e.g. `fixed_size_list<float32>[384]`."""
    import pyarrow as pa

    if pa.types.is_fixed_size_list(kind):
        return f"fixed_size_list<{arrow_type_name(kind.value_type)}>[{kind.list_size}]"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return f"{'large_' if pa.types.is_large_list(kind) else ''}list<{arrow_type_name(kind.value_type)}>"
    return {"halffloat": "float16", "float": "float32", "double": "float64"}.get(str(kind), str(kind))


def _check_output_options(out: Path, keep_columns, vector_column: str | None) -> None:
    if detect_format(out, OUTPUT_FORMATS) == "npy" and (keep_columns or vector_column is not None):
        raise ValueError(f"{out}: --keep-columns and --vector-column need .parquet output "
                         "(.npy holds the vectors only)")
    if vector_column is not None and (not isinstance(vector_column, str) or not vector_column):
        raise ValueError(f"the vector column needs a non-empty name, got {vector_column!r}")


def _describe(flow_path, flow_sha256: str, calibrator, encoder, batch_size: int) -> dict:
    """The manifest entries `calibrate_file` knows: the encoder (text input; for stored
    embeddings, null: the flow's `fitted_for` says what they should come from) and the flow."""
    from safetensors import safe_open

    with safe_open(str(flow_path), framework="pt") as reader:
        flow_version = (reader.metadata() or {}).get("format_version")
    recorded = calibrator.provenance
    described = None
    if encoder is not None:
        describe = getattr(encoder, "describe", None)
        described = describe() if describe is not None else {"model": encoder.model_id, "pooling": encoder.pooling}
        described["batch_size"] = batch_size
    return {
        "encoder": described,
        "calibration": {"method": "bert-flow", "path": str(Path(flow_path).resolve()), "sha256": flow_sha256,
                        "config": calibrator.config, "fitted_for": recorded.to_json() if recorded else None},
        "format_versions": {"flow_file": flow_version},
    }


def default_threads(text: bool) -> int:
    """torch CPU threads for a job, pinned (float results depend on the count, and a resumed job
    must be byte-identical to an uninterrupted one). Embeddings: one fewer than the CPUs
    available, so that the reader and writer threads keep a core and never deschedule torch's
    threads, which wait for each other at every operator. Text: 1, given to the encoder as a
    fixed count, the safe count for byte-identical resumes (docs/lab-notes.md); more
    threads for text are an explicit `--threads` choice."""
    return job_threads(text)


def encoder_for(calibrator, model: str | None, pooling: str | None, encoder_factory: Callable | None,
                 threads: int):
    """The encoder for text input: the flow's recorded one (`calibrator.provenance`) unless
    overridden (then checked by `check_compatible`)."""
    recorded = calibrator.provenance
    if recorded is None and model is None:
        raise ValueError("the flow file records no encoder (it was fitted on raw embeddings); "
                         "pass --model and --pooling for the encoder that produced them")
    if encoder_factory is None:
        from flowcore.text.encoder import Encoder as encoder_factory
    pooling = pooling or (recorded.pooling if recorded is not None else None)
    return encoder_factory(model=model or recorded.model, threads=threads, **({"pooling": pooling} if pooling else {}))
