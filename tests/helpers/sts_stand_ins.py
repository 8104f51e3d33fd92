"""Stand-ins shared by the STS tests: a deterministic hash encoder and a mean-shift calibrator."""
import hashlib

import numpy as np


class HashEncoder:
    """A deterministic stand-in encoder: a fixed random vector per distinct sentence, plus a large
    shared offset (an anisotropic cone, like raw BERT vectors); counts what it encodes."""

    def __init__(self, pooling="mean", dim=16, offset=20.0):
        self.model_id, self.pooling, self.dim = "hash-encoder", pooling, dim
        self.offset = offset
        self.encoded: list[str] = []

    def encode(self, sentences, batch_size=64, show_progress_bar=None):
        self.encoded += list(sentences)
        rows = []
        for sentence in sentences:
            seed = int.from_bytes(hashlib.sha256(sentence.encode()).digest()[:8], "little")
            rows.append(np.random.default_rng(seed).normal(size=self.dim) + self.offset)
        return np.asarray(rows, dtype=np.float32)


class MeanShift:
    """A stand-in calibrator: subtracts the fitted mean (removes the shared offset)."""

    fitted_rows: list[int] = []

    def fit(self, X):
        self.mean = X.mean(axis=0)
        MeanShift.fitted_rows.append(len(X))
        return self

    def transform(self, X):
        return X - self.mean
