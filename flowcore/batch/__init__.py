"""Batch calibration of whole corpora: row types, text and vector sources, the calibration core
both engines share, the streaming pipeline, durable outputs and the resumable local job behind
`flowcore calibrate` (the Ray engine is `flowcore.batch.ray`).

Modules, from the bottom up: `rows` (Reject, Position, Chunk, the reject reasons and rules),
`sampling` (the one row sampler), `text_sources` (TextCorpus, read_texts, sample_texts),
`vector_sources` (EmbeddingFile, the one .npy reader), `core` (JobSpec, calibrate_chunk, the
identity check, CalibrationSummary, the manifest), `pipeline` (calibrate_chunks, iter_calibrated,
BackgroundThread), `outputs` (.npy/.parquet outputs, the rejects log) and `job` (CalibrationJob,
its progress file, calibrate_file), with `lock` (one writer per output) and `interrupts`
(stopping at a chunk boundary on SIGINT/SIGTERM).
"""
from __future__ import annotations

from flowcore.batch.core import (
    CalibrationSummary,
    InputChangedError,
    JobMismatchError,
    JobSpec,
    calibrate_chunk,
    check_compatible,
)
from flowcore.batch.job import CalibrationJob, JobInterrupted, OutputLockedError, OutputWriteError, calibrate_file
from flowcore.batch.lock import OutputLock
from flowcore.batch.pipeline import calibrate_chunks, iter_calibrated
from flowcore.batch.rows import CalibratedChunk, Chunk, Position, Reject, TextRow, count_reasons
from flowcore.batch.sampling import sample_row_numbers, sample_stream
from flowcore.batch.text_sources import TextCorpus, read_texts, sample_texts
from flowcore.batch.vector_sources import EmbeddingFile, NpyMatrix

__all__ = [
    "CalibratedChunk", "CalibrationJob", "CalibrationSummary", "Chunk", "EmbeddingFile", "InputChangedError",
    "JobInterrupted", "JobMismatchError", "JobSpec", "NpyMatrix", "OutputLock", "OutputLockedError", "OutputWriteError",
    "Position", "Reject", "TextCorpus", "TextRow", "calibrate_chunk", "calibrate_chunks", "calibrate_file",
    "check_compatible", "count_reasons", "iter_calibrated", "read_texts", "sample_row_numbers",
    "sample_stream", "sample_texts",
]
