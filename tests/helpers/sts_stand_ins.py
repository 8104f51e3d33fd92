"""Stand-ins shared by the STS tests: a deterministic hash encoder and a mean-shift calibrator."""
import hashlib

import numpy as np

from flowcore import MeanCentering


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


class MeanShift(MeanCentering):
    """A stand-in calibrator: mean-centring (it removes the shared offset) that counts the rows it is fitted on."""

    fitted_rows: list[int] = []

    def fit_chunks(self, chunks, encoder=None):
        chunks = list(chunks)
        MeanShift.fitted_rows.append(sum(len(chunk) for chunk in chunks))
        return super().fit_chunks(chunks, encoder=encoder)
