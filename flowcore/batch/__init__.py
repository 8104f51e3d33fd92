"""Batch calibration of whole corpora: row types, text and vector sources, the streaming
pipeline, durable outputs and the resumable job behind `flowcore calibrate`.

Modules, from the bottom up: `rows` (Reject, Position, Chunk, reject reasons), `sampling` (the
one row sampler), `text_sources` (TextCorpus, read_texts, sample_texts), `vector_sources`
(EmbeddingFile, the one .npy reader), `pipeline` (calibrate_chunks, iter_calibrated,
check_compatible, BackgroundThread), `outputs` (.npy/.parquet outputs, the rejects log) and
`job` (CalibrationJob, its progress file and output manifest, calibrate_file), with `lock` (one
writer per output) and `interrupts` (stopping at a chunk boundary on SIGINT/SIGTERM).
"""
from __future__ import annotations

from flowcore.batch.job import (
    STAGES,
    CalibrationJob,
    CalibrationSummary,
    InputChangedError,
    JobInterrupted,
    JobMismatchError,
    OutputLockedError,
    OutputWriteError,
    calibrate_file,
    default_threads,
)
from flowcore.batch.lock import OutputLock
from flowcore.batch.pipeline import CalibratedChunk, calibrate_chunks, check_compatible, iter_calibrated
from flowcore.batch.rows import Chunk, Position, Reject, TextRow, count_reasons
from flowcore.batch.sampling import sample_row_numbers, sample_stream
from flowcore.batch.text_sources import TextCorpus, read_texts, sample_texts
from flowcore.batch.vector_sources import EmbeddingFile, NpyMatrix

__all__ = [
    "STAGES", "CalibratedChunk", "CalibrationJob", "CalibrationSummary", "Chunk", "EmbeddingFile",
    "InputChangedError", "JobInterrupted", "JobMismatchError", "NpyMatrix", "OutputLock", "OutputLockedError",
    "OutputWriteError", "Position", "Reject", "TextCorpus", "TextRow", "calibrate_chunks",
    "calibrate_file", "check_compatible", "count_reasons", "default_threads", "iter_calibrated",
    "read_texts", "sample_row_numbers", "sample_stream", "sample_texts",
]
