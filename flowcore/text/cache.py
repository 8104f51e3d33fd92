"""The one embedding cache: vectors stored per encoder (`encoder_key`), so nothing is encoded twice. Sentence sets
(`flowcore sts`, `analyze`) are kept per sentence, across datasets and runs; a whole corpus (`flowcore fit --input`)
as one memory-mapped .npy (`EmbeddingCache.corpus_file`), written resumably by `flowcore.batch.encode_corpus`."""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np

from flowcore import defaults
from flowcore._fs import atomic_write, atomic_write_json, write_error
from flowcore._progress import progress_wanted

__all__ = ["CACHE_ENV", "EmbeddingCache", "default_cache_dir", "encoder_key"]

CACHE_ENV = "FLOWCORE_CACHE"
CACHE_ADVICE = (f"this is the embedding cache: give a writable folder with --cache-dir DIR (or ${CACHE_ENV}), or "
                "encode without it with --no-cache")

logger = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """The cache folder from $FLOWCORE_CACHE, else ~/.cache/flowcore/embeddings."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "flowcore" / "embeddings")


def encoder_key(encoder) -> tuple[str, str]:
    """(model, pooling) naming an encoder's vectors: a local model folder by its absolute path, the pooling
    with the encoder's `max_length` and `quantize` mode (both change the vectors)."""
    model, pooling = str(encoder.model_id), str(encoder.pooling)
    model = os.path.abspath(model) if os.path.isdir(model) else model
    for option in ("max_length", "quantize"):
        if (value := getattr(encoder, option, None)) is not None:
            pooling = f"{pooling}@{option}={value}"
    return model, pooling


class EmbeddingCache:
    """Vectors stored per encoder (`encoder_key`) in `directory` (None: sentences in memory only).

    Sentences (`embed`) are kept in shards (`.npy` + the `.json` of its sentences) under a folder per
    encoder, written atomically and never modified, so concurrent runs are safe.

    Example:
        >>> cache = EmbeddingCache(default_cache_dir())
        >>> vectors = cache.embed(Encoder(), ["a sentence", "another one"])
    """

    def __init__(self, directory: str | os.PathLike | None):
        self.directory = Path(directory) if directory is not None else None
        self._memory: dict[tuple[str, str], dict[str, np.ndarray]] = {}

    def _folder(self, model: str, pooling: str) -> Path:
        digest = hashlib.sha256(json.dumps([model, pooling]).encode()).hexdigest()[:24]
        return self.directory / digest

    def corpus_file(self, encoder, corpus: str | os.PathLike, text_field: str) -> Path:
        """Where the vectors of `corpus` (a file, folder or glob; its `text_field`) through `encoder` are kept:
        `corpora/<key>.npy` (the batch job's manifest and rejects beside it), which the corpus's next encoding
        resumes, reuses when complete, or replaces when the corpus changed.

        Example:
            >>> EmbeddingCache("cache").corpus_file(Encoder(), "corpus.jsonl", "text")
            PosixPath('cache/corpora/4f0c…d1.npy')
        """
        if self.directory is None:
            raise ValueError("an embedding cache in memory keeps no corpus file")
        key = [*encoder_key(encoder), os.path.abspath(corpus), text_field]
        folder = self.directory / "corpora"
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise write_error(error, folder, advice=CACHE_ADVICE) from None
        return folder / f"{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:24]}.npy"

    def _known(self, model: str, pooling: str, dim: int) -> dict[str, np.ndarray]:
        key = (model, pooling)
        if key in self._memory:
            return self._memory[key]
        known: dict[str, np.ndarray] = {}
        if self.directory is not None:
            for meta_path in sorted(self._folder(model, pooling).glob("*.json")):
                try:
                    meta = json.loads(meta_path.read_text(encoding="utf-8"))
                    vectors = np.load(meta_path.with_suffix(".npy"), allow_pickle=False)
                except (OSError, ValueError) as error:
                    logger.warning(f"embedding cache: skipping unreadable shard {meta_path}: {error}")
                    continue
                if (meta.get("model"), meta.get("pooling")) != key or vectors.shape != (len(meta["sentences"]), dim):
                    logger.warning(f"embedding cache: skipping shard {meta_path} "
                                   "(it belongs to another model or width)")
                    continue
                known.update(zip(meta["sentences"], vectors))
        self._memory[key] = known
        return known

    def _store(self, model: str, pooling: str, sentences: list[str], vectors: np.ndarray) -> None:
        if self.directory is None:
            return
        folder = self._folder(model, pooling)
        stem = hashlib.sha256("\0".join(sentences).encode()).hexdigest()[:32]
        meta = {"model": model, "pooling": pooling, "dim": int(vectors.shape[1]), "sentences": sentences}
        try:
            folder.mkdir(parents=True, exist_ok=True)
            # The .npy first: a shard is found through its .json, which must never precede its vectors.
            atomic_write(folder / f"{stem}.npy", lambda handle: np.save(handle, vectors, allow_pickle=False))
            atomic_write_json(folder / f"{stem}.json", meta, ensure_ascii=False)
        except OSError as error:
            raise write_error(error, folder / f"{stem}.npy", vectors.nbytes, advice=CACHE_ADVICE) from None

    def embed(self, encoder, sentences: list[str], batch_size: int = defaults.BATCH_SIZE,
              show_progress_bar: bool | None = None) -> np.ndarray:
        """Vectors of `sentences` (rows aligned, repeats allowed), encoding only unseen ones.

        Args:
            encoder: a `flowcore.Encoder`, or anything with its `encode`, `model_id`, `pooling` and `dim`.
            sentences: the sentences to embed, in order; repeats are encoded once.
            batch_size: the encoding batch size for the sentences not cached yet.
            show_progress_bar: log what is encoded (INFO) and let the encoder show its progress bar.

        Returns:
            float32 (len(sentences), encoder.dim), row i the vector of sentences[i].
        """
        model, pooling = encoder_key(encoder)
        known = self._known(model, pooling, int(encoder.dim))
        missing = [s for s in dict.fromkeys(sentences) if s not in known]
        if missing:
            progress = progress_wanted(show_progress_bar)
            if progress:
                logger.info(f"encoding {len(missing)} sentences with {encoder.model_id} ({pooling} pooling)")
            vectors = np.asarray(encoder.encode(missing, batch_size=batch_size, show_progress_bar=progress),
                                 dtype=np.float32)
            if vectors.shape != (len(missing), int(encoder.dim)):
                raise ValueError(f"the encoder returned shape {vectors.shape} for {len(missing)} sentences")
            self._store(model, pooling, missing, vectors)
            known.update(zip(missing, vectors))
        return np.stack([known[s] for s in sentences]) if sentences else np.empty((0, int(encoder.dim)), np.float32)
