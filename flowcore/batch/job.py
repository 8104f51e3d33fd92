"""The local engine behind `flowcore calibrate`: `CalibrationJob` (a source into one .npy or
.parquet file, resumably) and `calibrate_file` (the whole job from files).

Each chunk is fsynced before `OUT.progress.json` records it, so a killed run resumes after the
last recorded chunk, byte-identical to an uninterrupted one (docs/batch.md, docs/faults.md).
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
    check_replaceable,
    free_bytes,
    fsync,
    remove_temporaries,
    write_error,
)
from flowcore._progress import progress_wanted
from flowcore.batch.core import (
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    CalibrationSummary,
    InputChangedError,
    JobMismatchError,
    JobSpec,
    check_identity,
    default_chunk_rows,
    encode_with,
    manifest,
)
from flowcore.batch.interrupts import JobInterrupted, StopSignals, interrupts_named
from flowcore.batch.lock import OutputLock, OutputLockedError
from flowcore.batch.outputs import NpyOutput, ParquetOutput, RejectsLog
from flowcore.batch.pipeline import QUEUE_DEPTH, BackgroundThread, calibrate_chunks
from flowcore.batch.rows import CalibratedChunk, Position, count_reasons, detect_format, file_changed
from flowcore.batch.text_sources import TextCorpus
from flowcore.batch.vector_sources import EmbeddingFile
from flowcore.runtime import check_threads, pinned_threads

__all__ = [
    "MANIFEST_FORMAT", "MANIFEST_VERSION", "OUTPUT_FORMATS", "PROGRESS_FORMAT", "PROGRESS_VERSION", "CalibrationJob",
    "CalibrationSummary", "InputChangedError", "JobInterrupted", "JobMismatchError", "OutputLockedError",
    "OutputWriteError", "calibrate_file",
]

OUTPUT_FORMATS = {".npy": "npy", ".parquet": "parquet"}
PROGRESS_FORMAT = "flowcore-calibrate-progress"
PROGRESS_VERSION = 2
"""`OUT.progress.json`, an unfinished job's record; an earlier flowcore's is refused."""
_EARLIER = ("{} records an unfinished run of an earlier flowcore, which this version cannot resume; "
            "rerun with --restart to start over")

RESUME_ADVICE = "the progress file records only the chunks completed before it; fix this and rerun the same command"


def _at_stage(stage: str, chunk: CalibratedChunk) -> None:
    """Called in the writer thread as each chunk is "writing", "written" and "committed": a fault-injection seam."""


@contextlib.contextmanager
def _writing(path: Path, needed: int | None = None, advice: str = RESUME_ADVICE):
    """An OSError inside the block, writing `path`, as a one-line `OutputWriteError`."""
    try:
        yield
    except OSError as error:
        raise write_error(error, path, needed, advice) from None


@dataclass
class _Progress:
    """What the progress file records after each completed chunk."""

    rows: int = 0
    offset: int = 0
    line: int = 0
    chunks: int = 0
    rejects_bytes: int = 0
    rejects: dict[str, int] = field(default_factory=dict)


class CalibrationJob:
    """Calibrate `source` into `out` (.npy or .parquet), resumably.

    Args:
        source: a `TextCorpus` or `EmbeddingFile`; its `keep_columns` become parquet columns.
        out: the output file, .npy (float32 rows) or .parquet (`id`, the vector column, the kept columns).
        transform: maps finite float32 (n, dim) rows to calibrated rows.
        dim: the width of the vectors `transform` takes.
        output_dim: the width of the vectors it returns (default: `dim`).
        encode: (text sources) maps a list of sentences to (n, dim) embeddings.
        identity: more entries of the job's identity (e.g. the flow file hash), which a resume must match.
        normalize: scale each calibrated row to unit length; part of the identity.
        vector_column: the parquet vector column's name (default "embedding"); part of the identity.
        description: more entries of the finished output's manifest, e.g. the encoder and the calibration.
        chunk_rows: rows per chunk, the resume granularity (default: `default_chunk_rows`).
        restart: ignore an unfinished earlier run and start over.
        show_progress_bar: a progress bar on stderr; None shows one when stderr is a terminal.
        threads: torch's CPU thread count for the run; part of the identity (results depend on it).

    Example:
        >>> source = EmbeddingFile("emb.npy")
        >>> CalibrationJob(source, "out.npy", calibrator.transform, source.dim).run()
    """

    def __init__(self, source: TextCorpus | EmbeddingFile, out: str | os.PathLike,
                 transform: Callable[[np.ndarray], np.ndarray], dim: int,
                 encode: Callable[[list[str]], np.ndarray] | None = None, identity: dict | None = None,
                 chunk_rows: int | None = None, restart: bool = False, show_progress_bar: bool | None = None,
                 threads: int | None = None, normalize: bool = False, vector_column: str | None = None,
                 description: dict | None = None, output_dim: int | None = None):
        self.source, self.dim, self.encode = source, dim, encode
        self.output_dim = output_dim or dim
        self.normalize = bool(normalize)
        self.transform = transform
        self.out = Path(out)
        self.format = detect_format(self.out, OUTPUT_FORMATS)
        if self.format == "npy" and (source.keep_columns or vector_column is not None):
            raise ValueError(f"{out}: --keep-columns and --vector-column need .parquet output "
                             "(.npy holds the vectors only)")
        self.vector_column = (vector_column or defaults.VECTOR_COLUMN) if self.format == "parquet" else None
        self.description = dict(description or {})
        self.progress_path = self.out.with_name(self.out.name + ".progress.json")
        self.manifest_path = self.out.with_name(self.out.name + ".manifest.json")
        self.rejects_path = self.out.with_name(self.out.name + ".rejects.jsonl")
        for path in (self.out, self.progress_path, self.manifest_path, self.rejects_path):
            check_replaceable(path)  # before any work: never a device, a pipe or a link loop
        if self.out.resolve() == Path(source.path).resolve():
            raise ValueError(f"the output {self.out} would overwrite the input")
        if not self.out.parent.is_dir():
            raise FileNotFoundError(f"output folder not found: {self.out.parent}")
        self.chunk_rows = chunk_rows or default_chunk_rows(source, dim)
        if self.chunk_rows < 1:
            raise ValueError(f"chunk_rows must be at least 1, got {self.chunk_rows}")
        self.restart, self.show_progress_bar = restart, progress_wanted(show_progress_bar)
        self.threads = check_threads(threads)
        self._identity = {**(identity or {}), **({"threads": threads} if threads is not None else {})}

    def identity(self) -> dict:
        """What the progress file records as this job."""
        return {"input": self.source.identity(),
                "output": {"path": str(self.out.resolve()), "format": self.format, "vector_column": self.vector_column},
                "dim": self.dim, **({"output_dim": self.output_dim} if self.output_dim != self.dim else {}),
                "chunk_rows": self.chunk_rows, "normalize": self.normalize, **self._identity}

    def run(self) -> CalibrationSummary:
        """Run (or resume) the job.

        Returns:
            the `CalibrationSummary`. Raises `OutputLockedError` while another job writes `out`,
            `JobInterrupted` when stopped by a signal, `OutputWriteError` when a write fails,
            `JobMismatchError`/`InputChangedError` when an unfinished run cannot be resumed.
        """
        started = time.perf_counter()
        lock = OutputLock(self.out)
        with _writing(lock.path, advice="choose a writable output folder"):
            lock.acquire()
        try:
            with StopSignals() as stop:
                summary = self._run(started, stop)
        finally:
            lock.release()
        summary.lock_taken_over = lock.took_over
        return summary

    def _load_progress(self, identity: dict) -> tuple[int, _Progress] | None:
        """(rows, progress) of an unfinished earlier run of the job `identity` (`OUT.progress.json`), or None."""
        if not self.progress_path.exists():
            kind = None  # an earlier flowcore recorded an unfinished run in OUT.manifest.json
            with contextlib.suppress(OSError, ValueError, AttributeError):
                kind = json.loads(self.manifest_path.read_text(encoding="utf-8")).get("format")
            if kind == "flowcore-calibrate-manifest":
                raise JobMismatchError(_EARLIER.format(self.manifest_path))
            return None
        try:
            record = json.loads(self.progress_path.read_text(encoding="utf-8"))
            if record.get("format") != PROGRESS_FORMAT or record.get("version") != PROGRESS_VERSION:
                raise ValueError("unknown progress file format")
            recorded, rows, progress = record["job"], record["rows"], _Progress(**record["done"])
            if not isinstance(recorded, dict) or not isinstance(rows, int):
                raise ValueError("no job identity or row count")
            fingerprinted = "fingerprint" in recorded["input"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise JobMismatchError(f"{self.progress_path}: unreadable progress file ({error}); "
                                   "rerun with --restart to start over") from None
        if not fingerprinted:
            raise JobMismatchError(_EARLIER.format(self.progress_path))
        check_identity(recorded, identity, self.progress_path, identity["input"]["path"])
        return rows, progress

    def _commit_progress(self, identity: dict, rows: int, progress: _Progress) -> None:
        atomic_write_json(self.progress_path, {"format": PROGRESS_FORMAT, "version": PROGRESS_VERSION, "job": identity,
                                               "rows": rows, "done": progress.__dict__}, indent=1, sort_keys=True)

    def _run(self, started: float, stop: StopSignals) -> CalibrationSummary:
        identity = self.identity()
        earlier = None if self.restart else self._load_progress(identity)
        rows, progress = earlier if earlier else (self.source.rows, _Progress())
        resumed_from = progress.rows
        if self.format == "npy":
            output = NpyOutput(self.out, rows, self.output_dim)
        else:
            output = ParquetOutput(self.out, rows, self.output_dim, with_ids=self.source.id_field is not None,
                                   vector_column=self.vector_column,
                                   meta_types=self.source.meta_types())
        rejects = RejectsLog(self.rejects_path)
        if earlier is None:
            with _writing(self.progress_path):
                self.progress_path.unlink(missing_ok=True)
                output.discard()
                rejects.discard()
        total_chunks = -(-rows // self.chunk_rows)
        if earlier is None or progress.chunks < total_chunks:
            needed = output.bytes_needed() if earlier is None else None
            free = free_bytes(self.out.parent)
            if needed is not None and free is not None and free < needed:  # refused before any work
                raise OutputWriteError(f"cannot write {output.chunk_path(0)}: it needs {needed:,} bytes and only "
                                       f"{free:,} are free on its file system; free some space or choose another --out")
            with contextlib.closing(output), contextlib.closing(rejects):
                with _writing(output.chunk_path(0), needed):
                    output.open(resume=earlier is not None)
                    rejects.open(progress.rejects_bytes if earlier is not None else None)
                    if earlier is None:
                        self._commit_progress(identity, rows, progress)
                with pinned_threads(self.threads):
                    self._stream(output, rejects, identity, rows, progress, stop)
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

    def manifest(self, rows: int, rejects: dict[str, int]) -> dict:
        """`OUT.manifest.json` of the finished output (`flowcore.batch.core.manifest`)."""
        source = self.source
        return manifest(file=self.out.name, parquet=self.out if self.format == "parquet" else None, rows=rows,
                        rejects=rejects, rejects_file=self.rejects_path.name, dim=self.output_dim,
                        normalized=self.normalize, id_field=source.id_field, vector_column=self.vector_column,
                        kept_columns=source.keep_columns, input={"kind": source.kind, **source.identity()},
                        description=self.description, threads=self.threads, chunk_rows=self.chunk_rows,
                        versions={"progress": PROGRESS_VERSION})

    def _stream(self, output, rejects: RejectsLog, identity: dict, rows: int, progress: _Progress,
                stop: StopSignals) -> None:
        from tqdm import tqdm

        bar = tqdm(total=rows, initial=progress.rows, unit="rows", unit_scale=True, dynamic_ncols=True,
                   disable=not self.show_progress_bar, file=sys.stderr, desc="calibrate")

        def write(chunk: CalibratedChunk) -> None:
            if stop.requested:  # chunks read ahead of a stop are dropped, to be redone on resume
                return
            changed = file_changed(identity["input"])
            if changed is not None or chunk.end.row > rows:
                raise InputChangedError.while_read(self.source.path, changed or f"it now has more than {rows:,} rows")
            _at_stage("writing", chunk)
            with _writing(output.chunk_path(chunk.index), chunk.vectors.nbytes):
                output.write(chunk)
                output.sync()
            with _writing(rejects.partial):
                rejects_bytes = rejects.append(chunk.rejects)
            _at_stage("written", chunk)
            for reason, count in count_reasons(chunk.rejects).items():
                progress.rejects[reason] = progress.rejects.get(reason, 0) + count
            progress.rows, progress.offset, progress.line = chunk.end.row, chunk.end.offset, chunk.end.line
            progress.chunks, progress.rejects_bytes = chunk.index + 1, rejects_bytes
            with _writing(self.progress_path):
                self._commit_progress(identity, rows, progress)
            bar.update(len(chunk.vectors))
            _at_stage("committed", chunk)

        chunks = self.source.chunks(self.chunk_rows, Position(progress.rows, progress.offset, progress.line))
        calibrated = calibrate_chunks(chunks, self.transform, self.dim, self.encode, output_dim=self.output_dim,
                                      normalize=self.normalize)
        with bar, BackgroundThread.writing(write, QUEUE_DEPTH) as writer, contextlib.closing(calibrated):
            for chunk in calibrated:
                if stop.requested:
                    break
                writer.put(chunk)
        if progress.rows != rows and not stop.requested:
            raise InputChangedError.while_read(self.source.path, f"expected {rows:,} rows, read {progress.rows:,}")


@interrupts_named()
def calibrate_file(flow_path: str | os.PathLike, out: str | os.PathLike, *, encoder=None, restart: bool = False,
                   show_progress_bar: bool | None = None, **options) -> CalibrationSummary:
    """Calibrate a text corpus or stored embeddings with the calibration file at `flow_path` into
    `out` (.npy or .parquet), resumably, described in `OUT.manifest.json`.

    Args:
        flow_path: a calibration file written by `flowcore fit`.
        out: the output file; see `CalibrationJob`.
        encoder: (text) an `Encoder` to use instead of the one `options` name (still checked).
        restart: ignore an unfinished earlier run and start over.
        show_progress_bar: a progress bar on stderr; None shows one when stderr is a terminal.
        **options: the job, as `flowcore.batch.core.JobSpec` takes it (`input` or `embeddings`, ...).

    Example:
        >>> calibrate_file("model.flow", "vectors.parquet", input="corpus.jsonl", id_field="id", normalize=True)
    """
    spec = JobSpec(flow_path, **options)
    calibrator, (source,), encoder = spec.prepare([spec.path], encoder)
    job = CalibrationJob(source, out, calibrator.transform, calibrator.dim, encode_with(encoder, spec.batch_size),
                         identity=spec.identity(encoder), chunk_rows=spec.chunk_rows, restart=restart,
                         show_progress_bar=show_progress_bar, threads=spec.threads, normalize=spec.normalize,
                         vector_column=spec.vector_column, description=spec.describe(calibrator, encoder),
                         output_dim=calibrator.output_dim)
    return job.run()

