"""Batch calibration of whole corpora: row types, sources, the calibration core both engines share, the
streaming pipeline, durable outputs and the resumable local job behind `flowcore calibrate` (the Ray engine
is `flowcore.batch.ray`). docs/design.md lists the modules."""
from __future__ import annotations

from flowcore.batch.core import (
    CalibrationSummary,
    InputChangedError,
    JobMismatchError,
    JobSpec,
    calibrate_chunk,
    check_compatible,
)
from flowcore.batch.input_files import InputFiles
from flowcore.batch.job import (
    CalibrationJob,
    EncodedCorpus,
    JobInterrupted,
    OutputLockedError,
    OutputWriteError,
    calibrate_file,
    encode_corpus,
)
from flowcore.batch.lock import OutputLock
from flowcore.batch.pipeline import calibrate_chunks, iter_calibrated
from flowcore.batch.rows import CalibratedChunk, Chunk, Position, Reject, TextRow, count_reasons
from flowcore.batch.sampling import sample_row_numbers, sample_stream
from flowcore.batch.text_sources import TextCorpus, read_texts, sample_texts
from flowcore.batch.vector_sources import EmbeddingFile, NpyMatrix

__all__ = ["CalibratedChunk", "CalibrationJob", "CalibrationSummary", "Chunk", "EmbeddingFile", "EncodedCorpus",
           "InputChangedError", "InputFiles", "JobInterrupted", "JobMismatchError", "JobSpec", "NpyMatrix",
           "OutputLock", "OutputLockedError", "OutputWriteError", "Position", "Reject", "TextCorpus", "TextRow",
           "calibrate_chunk", "calibrate_chunks", "calibrate_file", "check_compatible", "count_reasons",
           "encode_corpus", "iter_calibrated", "read_texts", "sample_row_numbers", "sample_stream", "sample_texts"]
