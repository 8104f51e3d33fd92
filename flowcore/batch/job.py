"""The local engine behind `flowcore calibrate`: `CalibrationJob` (a source into one .npy or .parquet file,
resumably) and `calibrate_file`, a chunk loop on the shared `JobLifecycle`. Each chunk is fsynced before
`OUT.progress.json` records it, so a killed run resumes byte-identical (docs/batch.md, docs/faults.md)."""
from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from flowcore import defaults
from flowcore._fs import OutputWriteError, check_replaceable, free_bytes, fsync
from flowcore._progress import ProgressReport
from flowcore.batch.core import (
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    CalibrationSummary,
    InputChangedError,
    JobMismatchError,
    JobSpec,
    default_chunk_rows,
    encode_with,
    manifest,
)
from flowcore.batch.input_files import InputFiles
from flowcore.batch.interrupts import JobInterrupted, interrupts_named
from flowcore.batch.lifecycle import JobLifecycle, JobRecord, job_identity, writing
from flowcore.batch.lock import OutputLock, OutputLockedError
from flowcore.batch.outputs import NpyOutput, ParquetOutput, RejectsLog
from flowcore.batch.pipeline import QUEUE_DEPTH, BackgroundThread, calibrate_chunks
from flowcore.batch.rows import CalibratedChunk, Position, count_reasons, detect_format
from flowcore.batch.text_sources import TextCorpus
from flowcore.batch.vector_sources import EmbeddingFile, NpyMatrix
from flowcore.runtime import calibration_threads, check_threads, pinned_threads
from flowcore.text.cache import encoder_key

logger = logging.getLogger(__name__)

__all__ = ["MANIFEST_FORMAT", "MANIFEST_VERSION", "OUTPUT_FORMATS", "PROGRESS_FORMAT", "PROGRESS_VERSION",
           "CalibrationJob", "CalibrationSummary", "EncodedCorpus", "InputChangedError", "JobInterrupted",
           "JobMismatchError", "OutputLockedError", "OutputWriteError", "calibrate_file", "encode_corpus"]

OUTPUT_FORMATS = {".npy": "npy", ".parquet": "parquet"}
PROGRESS_FORMAT = "flowcore-calibrate-progress"
PROGRESS_VERSION = 2
"""`OUT.progress.json`, an unfinished job's record; an earlier flowcore's is refused."""
_EARLIER = ("{} records an unfinished run of an earlier flowcore, which this version cannot resume; "
            "rerun with --restart to start over")


def _at_stage(stage: str, chunk: CalibratedChunk) -> None:
    """Called in the writer thread as each chunk is "writing", "written" and "committed": a fault-injection seam."""


@dataclass
class _Progress:
    """What the progress file records after each completed chunk."""

    rows: int = 0
    offset: int = 0
    line: int = 0
    chunks: int = 0
    rejects_bytes: int = 0
    rejects: dict[str, int] = field(default_factory=dict)


class _ProgressRecord(JobRecord):
    """`OUT.progress.json` (`_Progress`); an earlier flowcore's unfinished run (recorded in `OUT.manifest.json`,
    or without input fingerprints) is refused."""

    def __init__(self, out: Path):
        super().__init__(out.with_name(out.name + ".progress.json"), PROGRESS_FORMAT, PROGRESS_VERSION, "progress file")
        self.manifest_path = out.with_name(out.name + ".manifest.json")

    def read(self) -> dict | None:
        if not self.path.exists():
            kind = None
            with contextlib.suppress(OSError, ValueError, AttributeError):
                kind = json.loads(self.manifest_path.read_text(encoding="utf-8")).get("format")
            if kind == "flowcore-calibrate-manifest":
                raise JobMismatchError(_EARLIER.format(self.manifest_path))
            return None
        record = super().read()
        try:
            done, recorded_input = _Progress(**record["done"]), record["job"]["input"]
            if not isinstance(record["rows"], int):
                raise ValueError("no row count")
            fingerprinted = "fingerprint" in recorded_input or "files" in recorded_input
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise self.unreadable(error) from None
        if not fingerprinted:
            raise JobMismatchError(_EARLIER.format(self.path))
        return {**record, "done": done}


class CalibrationJob:
    """Calibrate `source` into `out` (.npy or .parquet), resumably.

    Args:
        source: a `TextCorpus`, an `EmbeddingFile` or several as `InputFiles`; its `keep_columns` become
            parquet columns.
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
        restart: ignore an earlier run, unfinished or finished, and start over.
        show_progress_bar: False for silence; else a bar on a terminal, progress lines elsewhere.
        threads: the run's CPU threads (text: the encoder's, `runtime.calibration_threads`); part of the identity.
        what: the job's name in its progress lines ("calibrate"; "encode" for an identity `transform`).

    A rerun of a finished job does nothing and says so (`CalibrationSummary.complete`).

    Example:
        >>> source = EmbeddingFile("emb.npy")
        >>> CalibrationJob(source, "out.npy", calibrator.transform, source.dim).run()
    """

    def __init__(self, source: TextCorpus | EmbeddingFile | InputFiles, out: str | os.PathLike,
                 transform: Callable[[np.ndarray], np.ndarray], dim: int,
                 encode: Callable[[list[str]], np.ndarray] | None = None, identity: dict | None = None,
                 chunk_rows: int | None = None, restart: bool = False, show_progress_bar: bool | None = None,
                 threads: int | None = None, normalize: bool = False, vector_column: str | None = None,
                 description: dict | None = None, output_dim: int | None = None, what: str = "calibrate"):
        self.source, self.out, self.transform, self.encode = InputFiles.of(source), Path(out), transform, encode
        self.dim, self.output_dim, self.normalize, self.what = dim, output_dim or dim, bool(normalize), what
        self.format = detect_format(self.out, OUTPUT_FORMATS)
        if self.format == "npy" and (self.source.keep_columns or vector_column is not None):
            raise ValueError(f"{out}: --keep-columns and --vector-column need .parquet output "
                             "(.npy holds the vectors only)")
        self.vector_column = (vector_column or defaults.VECTOR_COLUMN) if self.format == "parquet" else None
        self.description = dict(description or {})
        self.record = _ProgressRecord(self.out)
        self.progress_path, self.manifest_path = self.record.path, self.record.manifest_path
        self.rejects_path = self.out.with_name(self.out.name + ".rejects.jsonl")
        for path in (self.out, self.progress_path, self.manifest_path, self.rejects_path):
            check_replaceable(path)  # before any work: never a device, a pipe or a link loop
        if self.source.single and self.out.resolve() == self.source.path.resolve():
            raise ValueError(f"the output {self.out} would overwrite the input")
        parts = self.out.with_name(self.out.name + ".parts") / "part-00000000.parquet"  # a parquet output's chunk
        if not self.source.single and (self.source.reaches(self.out) or self.source.reaches(parts)):
            raise ValueError(f"the output {self.out} is where the input {self.source.path} finds its files, so a "
                             "rerun would read it as input; choose another --out")
        if not self.out.parent.is_dir():
            raise FileNotFoundError(f"output folder not found: {self.out.parent}")
        self.chunk_rows = chunk_rows or default_chunk_rows(self.source, dim)
        if self.chunk_rows < 1:
            raise ValueError(f"chunk_rows must be at least 1, got {self.chunk_rows}")
        self.restart, self.show_progress_bar, self.threads = restart, show_progress_bar, check_threads(threads)
        self._identity = dict(identity or {})

    def identity(self) -> dict:
        """What the progress file records as this job (`job_identity`)."""
        return job_identity(self.source, self.out, self.format, self.vector_column, self.dim, self.output_dim,
                            self.chunk_rows, self.normalize, self.threads, **self._identity)

    def run(self) -> CalibrationSummary:
        """Run (or resume) the job; returns its `CalibrationSummary`. Raises `OutputLockedError` while another job
        writes `out`, `JobInterrupted` when stopped by a signal, `OutputWriteError` when a write fails, and
        `JobMismatchError`/`InputChangedError` when an unfinished run cannot be resumed."""
        identity = self.identity()
        with JobLifecycle(self.out, OutputLock(self.out), self.record, identity,
                          identity["input"].get("path", self.source.path), self.restart, self.rejects_path,
                          self.manifest_path) as job:
            if job.earlier is None and (done := job.complete(self.out.exists() and self.rejects_path.exists())):
                return done
            return self._run(job)

    def _run(self, job: JobLifecycle) -> CalibrationSummary:
        earlier = job.earlier
        rows, progress = (earlier["rows"], earlier["done"]) if earlier else (self.source.rows, _Progress())
        resumed_from = progress.rows
        if self.format == "npy":
            output = NpyOutput(self.out, rows, self.output_dim)
        else:
            output = ParquetOutput(self.out, rows, self.output_dim, with_ids=self.source.id_field is not None,
                                   vector_column=self.vector_column, meta_types=self.source.meta_types())
        rejects = RejectsLog(self.rejects_path)
        if earlier is None:
            with writing(self.progress_path):
                self.progress_path.unlink(missing_ok=True)
                output.discard()
                rejects.discard()
        total_chunks = self.source.chunk_count(self.chunk_rows)
        if earlier is None or progress.chunks < total_chunks:
            needed = output.bytes_needed() if earlier is None else None
            free = free_bytes(self.out.parent)
            if needed is not None and free is not None and free < needed:  # refused before any work
                raise OutputWriteError(f"cannot write {output.chunk_path(0)}: it needs {needed:,} bytes and only "
                                       f"{free:,} are free on its file system; free some space or choose another --out")
            with contextlib.closing(output), contextlib.closing(rejects):
                with writing(output.chunk_path(0), needed):
                    output.open(resume=earlier is not None)
                    rejects.open(progress.rejects_bytes if earlier is not None else None)
                    if earlier is None:
                        job.commit(rows=rows, done=progress.__dict__)
                resumed = f"resuming {self.out} at row {progress.rows:,} of {rows:,}" if earlier else None
                with job.report(rows, progress.rows, self.show_progress_bar, resumed, self.what) as report, \
                        pinned_threads(calibration_threads(self.threads, self.source.kind == "text")):
                    self._stream(output, rejects, job, rows, progress, report)
            if job.stop.requested and progress.chunks < total_chunks:  # stopped at a chunk boundary
                raise JobInterrupted(progress.rows, job.stop.signum)
        with writing(self.out):
            output.finish(total_chunks)
            rejects.finish()
            fsync(self.out.parent)
        job.finish(self.manifest(rows, progress.rejects))
        with writing(self.out):
            output.discard()
        return job.summary(rows, progress.rejects, rows - resumed_from)

    def manifest(self, rows: int, rejects: dict[str, int]) -> dict:
        """`OUT.manifest.json` of the finished output (`flowcore.batch.core.manifest`)."""
        return manifest(file=self.out.name, parquet=self.out if self.format == "parquet" else None, rows=rows,
                        rejects=rejects, rejects_file=self.rejects_path.name, dim=self.output_dim,
                        normalized=self.normalize, vector_column=self.vector_column, source=self.source,
                        description=self.description, threads=self.threads, chunk_rows=self.chunk_rows,
                        versions={"progress": PROGRESS_VERSION})

    def _stream(self, output, rejects: RejectsLog, job: JobLifecycle, rows: int, progress: _Progress,
                report: ProgressReport) -> None:
        def write(chunk: CalibratedChunk) -> None:
            if job.stop.requested:  # chunks read ahead of a stop are dropped, to be redone on resume
                return
            changed = self.source.changed(job.identity["input"])
            if changed is not None or chunk.end.row > rows:
                raise InputChangedError.while_read(self.source.path, changed or f"it now has more than {rows:,} rows")
            _at_stage("writing", chunk)
            with writing(output.chunk_path(chunk.index), chunk.vectors.nbytes):
                output.write(chunk)
                output.sync()
            with writing(rejects.partial):
                rejects_bytes = rejects.append(chunk.rejects)
            _at_stage("written", chunk)
            for reason, count in count_reasons(chunk.rejects).items():
                progress.rejects[reason] = progress.rejects.get(reason, 0) + count
            progress.rows, progress.offset, progress.line = chunk.end.row, chunk.end.offset, chunk.end.line
            progress.chunks, progress.rejects_bytes = chunk.index + 1, rejects_bytes
            with writing(self.progress_path):
                job.commit(rows=rows, done=progress.__dict__)
            report.advance(len(chunk.vectors))
            _at_stage("committed", chunk)

        chunks = self.source.chunks(self.chunk_rows, Position(progress.rows, progress.offset, progress.line))
        calibrated = calibrate_chunks(chunks, self.transform, self.dim, self.encode, output_dim=self.output_dim,
                                      normalize=self.normalize)
        with BackgroundThread.writing(write, QUEUE_DEPTH) as writer, contextlib.closing(calibrated):
            for chunk in calibrated:
                if job.stop.requested:
                    break
                writer.put(chunk)
        if progress.rows != rows and not job.stop.requested:
            raise InputChangedError.while_read(self.source.path, f"expected {rows:,} rows, read {progress.rows:,}")


@interrupts_named()
def calibrate_file(flow_path: str | os.PathLike, out: str | os.PathLike, *, encoder=None, restart: bool = False,
                   show_progress_bar: bool | None = None, **options) -> CalibrationSummary:
    """Calibrate a text corpus or stored embeddings (a file, a folder or a glob of them) with the
    calibration file at `flow_path` into `out` (.npy or .parquet), resumably, described in
    `OUT.manifest.json`; a rerun of a finished job does nothing (`restart=True` does it again).

    Args:
        flow_path: a calibration file written by `flowcore fit`.
        out: the output file; see `CalibrationJob`.
        encoder: (text) an `Encoder` to use instead of the one `options` name (still checked).
        restart: ignore an earlier run, unfinished or finished, and start over.
        show_progress_bar: False for silence; else a bar on a terminal, progress lines elsewhere.
        **options: the job, as `flowcore.batch.core.JobSpec` takes it (`input` or `embeddings`, ...).

    Example:
        >>> calibrate_file("model.flow", "vectors.parquet", input="corpus/", id_field="id", normalize=True)
    """
    spec = JobSpec(flow_path, **options)
    source = spec.source()
    calibrator, encoder = spec.prepare(source, encoder)
    return CalibrationJob(source, out, calibrator.transform, calibrator.dim, encode_with(encoder, spec.batch_size),
                          identity=spec.identity(encoder), chunk_rows=spec.chunk_rows, restart=restart,
                          show_progress_bar=show_progress_bar, threads=spec.threads, normalize=spec.normalize,
                          vector_column=spec.vector_column, description=spec.describe(calibrator, encoder),
                          output_dim=calibrator.output_dim).run()


@dataclass
class EncodedCorpus:
    """A corpus as `encode_corpus` leaves it: `vectors` (memory-mapped, row i the corpus's row i, a rejected
    row's vector undefined), `good` (the numbers of the rows to use; None: all) and the job's `summary`."""

    vectors: np.ndarray
    good: np.ndarray | None
    summary: CalibrationSummary


def encode_corpus(source: TextCorpus | EmbeddingFile | InputFiles, out: str | os.PathLike, encoder=None, *,
                  batch_size: int = defaults.BATCH_SIZE, restart: bool = False,
                  show_progress_bar: bool | None = None) -> EncodedCorpus:
    """Encode the text corpus `source` with `encoder` (stored vectors: gather them as they are) into `out`
    (.npy, memory-mapped on return) as a resumable job ("encode" in its progress lines): a rerun reuses a
    finished `out` of the same corpus and encoder, resumes an unfinished one, and encodes again one of
    another corpus or encoder. `fit --input` keeps `out` in the embedding cache (`EmbeddingCache.corpus_file`).

    Args:
        source: the corpus: a `TextCorpus` or an `EmbeddingFile`, or several files as `InputFiles`.
        out: the .npy file (its manifest and rejects list beside it).
        encoder: (text) a `flowcore.Encoder`; its `threads` are the job's.
        batch_size: sentences per encoder batch.
        restart: encode again, whatever `out` holds.
        show_progress_bar: False for silence; else a bar on a terminal, progress lines elsewhere.

    Example:
        >>> corpus = encode_corpus(TextCorpus("corpus.jsonl"), "corpus.npy", Encoder())
        >>> corpus.vectors.shape, corpus.summary.rejected
    """
    source = InputFiles.of(source)
    if (source.kind == "text") != (encoder is not None):
        raise ValueError("text needs an encoder, stored vectors none")
    if encoder is not None:
        model, pooling = encoder_key(encoder)
        identity, dim = {"encoder": {"model": model, "pooling": pooling, "batch_size": batch_size}}, encoder.dim
    else:
        dim = next((file.dim for file in source.sources if file.dim is not None), None)
        if dim is None:
            raise ValueError(f"{source.path} holds no vector to tell their width")
        identity = {}
        source.expect_width(dim)  # every file's vectors as wide as the first's

    def job(again: bool) -> CalibrationJob:
        return CalibrationJob(source, out, lambda vectors: vectors, dim, encode_with(encoder, batch_size),
                              identity=identity, restart=again, show_progress_bar=show_progress_bar,
                              threads=encoder.threads if encoder is not None else None, description=identity,
                              what="encode")

    try:
        summary = job(restart).run()
    except JobMismatchError as reason:  # an unfinished encoding of something else (or a changed input)
        logger.warning(f"encoding {out} again: {reason}")
        summary = job(True).run()
    vectors, good = NpyMatrix(out).read(), None
    if summary.rejected:  # the good rows' numbers (8 bytes a row), never a copy of their vectors
        with open(summary.rejects_path, encoding="utf-8") as lines:
            good = np.delete(np.arange(len(vectors)), [json.loads(line)["row"] for line in lines])
    return EncodedCorpus(vectors, good, summary)
