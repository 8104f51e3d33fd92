"""STS evaluation, the BERT-flow experiment end to end: frozen encoder → calibration
(none | whitening | flow, fitted without labels) → cosine similarity → Spearman/Pearson ×100.

Everything heavy is injectable (the encoder, the calibrator factories), so the protocol can be
tested with stand-ins; sentence vectors are cached on disk per model, pooling and sentence.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
from scipy.stats import pearsonr, spearmanr

from flowcore.sts.data import DATASETS, STSPairs, load_split, load_test, read_sentence_file, splits

CALIBRATIONS = ("none", "whitening", "flow")
AGGREGATIONS = ("all", "wmean", "mean")
MULTI_SUBSET = ("STS12", "STS13", "STS14", "STS15", "STS16")
CACHE_ENV = "FLOWCORE_CACHE"

AGGREGATION_NOTES = {
    "all": "STS12-16: subsets concatenated, one correlation (SBERT, SimCSE, MTEB)",
    "wmean": "STS12-16: size-weighted mean of per-subset correlations (BERT-flow, BERT-whitening)",
    "mean": "STS12-16: plain mean of per-subset correlations",
}


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- metrics

def cosine_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two (N, D) arrays, computed in float64."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(axis=1) / np.maximum(norms, np.finfo(np.float64).tiny)


def correlations(predicted: np.ndarray, gold: np.ndarray) -> dict:
    """Spearman and Pearson ×100 of predicted similarities against gold scores."""
    if np.ptp(predicted) == 0:
        return {"spearman": math.nan, "pearson": math.nan}
    return {"spearman": 100 * float(spearmanr(predicted, gold)[0]),
            "pearson": 100 * float(pearsonr(predicted, gold)[0])}


def score_pairs(similarities: np.ndarray, pairs: STSPairs) -> dict:
    """Correlations of one dataset; for STS12–16 also per subset and all three aggregations
    (`spearman`/`pearson` are the `all` aggregation, the others are under `*_wmean`, `*_mean`)."""
    result = {**correlations(similarities, pairs.scores), "n_pairs": len(pairs)}
    if pairs.dataset not in MULTI_SUBSET:
        result["aggregation"] = "single"
        return result
    names = list(dict.fromkeys(pairs.subsets))
    labels = np.asarray(pairs.subsets)
    subsets = {}
    for name in names:
        mask = labels == name
        subsets[name] = {**correlations(similarities[mask], pairs.scores[mask]), "n_pairs": int(mask.sum())}
    sizes = np.array([subsets[n]["n_pairs"] for n in names], dtype=np.float64)
    for metric in ("spearman", "pearson"):
        values = np.array([subsets[n][metric] for n in names])
        result[f"{metric}_wmean"] = float((values * sizes).sum() / sizes.sum())
        result[f"{metric}_mean"] = float(values.mean())
    result["aggregation"] = "all"
    result["subsets"] = subsets
    return result


def spearman_of(record: dict, aggregation: str) -> float | None:
    """The record's Spearman under `aggregation` (single-set datasets have only one)."""
    if aggregation == "all" or record.get("aggregation") == "single":
        return record.get("spearman")
    return record.get(f"spearman_{aggregation}")


# --------------------------------------------------------------------------- embedding cache

def _model_key(model_id: str) -> str:
    """A local model folder is identified by its absolute path, a hub or alias name as given."""
    return os.path.abspath(model_id) if os.path.isdir(model_id) else model_id


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "flowcore" / "embeddings")


class EmbeddingCache:
    """Sentence vectors stored per (model, pooling, sentence), so nothing is encoded twice.
    The pooling key carries the encoder's `max_length` when it has one (truncation changes vectors).

    On disk (when `directory` is given): `<directory>/<sha of model+pooling>/<sha of sentences>.npy`
    holds a float32 matrix and the `.json` beside it the model, pooling and the exact sentences of
    its rows. Shards are written atomically and never modified, so concurrent runs are safe.
    """

    def __init__(self, directory: str | os.PathLike | None):
        self.directory = Path(directory) if directory is not None else None
        self._memory: dict[tuple[str, str], dict[str, np.ndarray]] = {}

    def _folder(self, model: str, pooling: str) -> Path:
        digest = hashlib.sha256(json.dumps([model, pooling]).encode()).hexdigest()[:24]
        return self.directory / digest

    def _known(self, model: str, pooling: str, dim: int) -> dict[str, np.ndarray]:
        key = (model, pooling)
        if key in self._memory:
            return self._memory[key]
        known: dict[str, np.ndarray] = {}
        if self.directory is not None and self._folder(model, pooling).is_dir():
            for meta_path in sorted(self._folder(model, pooling).glob("*.json")):
                try:
                    meta = json.loads(meta_path.read_text(encoding="utf-8"))
                    vectors = np.load(meta_path.with_suffix(".npy"), allow_pickle=False)
                except (OSError, ValueError) as error:
                    _log(f"embedding cache: skipping unreadable shard {meta_path}: {error}")
                    continue
                if (meta.get("model"), meta.get("pooling")) != key or vectors.shape != (len(meta["sentences"]), dim):
                    _log(f"embedding cache: skipping shard {meta_path} (it belongs to another model or width)")
                    continue
                known.update(zip(meta["sentences"], vectors))
        self._memory[key] = known
        return known

    def _store(self, model: str, pooling: str, sentences: list[str], vectors: np.ndarray) -> None:
        if self.directory is None:
            return
        folder = self._folder(model, pooling)
        folder.mkdir(parents=True, exist_ok=True)
        stem = hashlib.sha256("\0".join(sentences).encode()).hexdigest()[:32]
        meta = {"model": model, "pooling": pooling, "dim": int(vectors.shape[1]), "sentences": sentences}
        for suffix, write in ((".npy", lambda f: np.save(f, vectors, allow_pickle=False)),
                              (".json", lambda f: f.write(json.dumps(meta, ensure_ascii=False).encode()))):
            temporary = folder / f".{stem}{suffix}.{os.getpid()}.tmp"
            with open(temporary, "wb") as handle:
                write(handle)
            os.replace(temporary, folder / f"{stem}{suffix}")

    def embed(self, encoder, sentences: list[str], batch_size: int = 64, progress: bool = True) -> np.ndarray:
        """Vectors of `sentences` (rows aligned, repeats allowed), encoding only unseen ones."""
        model, pooling = _model_key(str(encoder.model_id)), str(encoder.pooling)
        if getattr(encoder, "max_length", None) is not None:
            pooling = f"{pooling}@max_length={encoder.max_length}"
        known = self._known(model, pooling, int(encoder.dim))
        missing = [s for s in dict.fromkeys(sentences) if s not in known]
        if missing:
            if progress:
                _log(f"encoding {len(missing)} sentences with {encoder.model_id} ({pooling} pooling)")
            vectors = np.asarray(encoder.encode(missing, batch_size=batch_size, show_progress_bar=progress),
                                 dtype=np.float32)
            if vectors.shape != (len(missing), int(encoder.dim)):
                raise ValueError(f"the encoder returned shape {vectors.shape} for {len(missing)} sentences")
            self._store(model, pooling, missing, vectors)
            known.update(zip(missing, vectors))
        return np.stack([known[s] for s in sentences]) if sentences else np.empty((0, int(encoder.dim)), np.float32)


# --------------------------------------------------------------------------- calibrations

class NoCalibration:
    """The raw encoder vectors."""

    def fit(self, X) -> "NoCalibration":
        return self

    def transform(self, X) -> np.ndarray:
        return np.asarray(X, dtype=np.float32)


class FlowCalibration:
    """The flow as `flowcore sts` runs it. `input` says what the flow is fitted on:
    `standardize` (the engine's default: coordinates standardised over the fit corpus, constant
    ones bypassing the flow; raw mean-pooled all-MiniLM-L6-v2 otherwise diverges), `raw` (the
    vectors unchanged, as the paper's code) or `whiten` (BERT-whitening first)."""

    INPUTS = ("standardize", "whiten", "raw")

    def __init__(self, flow_factory, input: str = "standardize", progress: bool = True):
        if input not in self.INPUTS:
            raise ValueError(f"unknown flow input {input!r}; choose from {', '.join(self.INPUTS)}")
        self.input, self.progress = input, progress
        self.flow = flow_factory(standardize=input == "standardize")
        self.whitening = None

    @property
    def losses(self) -> list[float]:
        return self.flow.losses

    def _prepared(self, X):
        return self.whitening.transform(X) if self.whitening is not None else X

    def fit(self, X) -> "FlowCalibration":
        if self.input == "whiten":
            from flowcore.calibration.whitening import Whitening

            self.whitening = Whitening().fit(X)
        self.flow.fit(self._prepared(X), progress=self.progress)
        return self

    def transform(self, X) -> np.ndarray:
        return self.flow.transform(self._prepared(X))


@dataclass(frozen=True)
class CalibrationSettings:
    """Hyper-parameters of the fitted calibrations (recorded with each result)."""

    whitening_dim: int | None = None
    flow_config: str = "l2_d3_w32"
    flow_epochs: int = 1
    flow_lr: float = 3e-4
    flow_batch_size: int = 32
    flow_input: str = "standardize"
    seed: int = 0
    device: str | None = None


def build_calibrator(name: str, settings: CalibrationSettings, progress: bool = True):
    """A fresh, unfitted calibrator with `fit(X)` and `transform(X)`."""
    if name == "none":
        return NoCalibration()
    if name == "whitening":
        from flowcore.calibration.whitening import Whitening

        return Whitening(dim=settings.whitening_dim)
    if name == "flow":
        from flowcore.calibration.calibrator import FlowCalibrator

        def flow_factory(standardize: bool) -> FlowCalibrator:
            return FlowCalibrator(config=settings.flow_config, epochs=settings.flow_epochs,
                                  batch_size=settings.flow_batch_size, lr=settings.flow_lr,
                                  seed=settings.seed, device=settings.device, standardize=standardize)

        return FlowCalibration(flow_factory, input=settings.flow_input, progress=progress)
    raise ValueError(f"unknown calibration {name!r}; choose from {', '.join(CALIBRATIONS)}")


def _settings_record(name: str, settings: CalibrationSettings) -> dict:
    if name == "whitening":
        return {"whitening_dim": settings.whitening_dim}
    if name == "flow":
        return {key: value for key, value in asdict(settings).items() if key.startswith("flow_") or key == "seed"}
    return {}


# --------------------------------------------------------------------------- fit corpora

def fit_corpus_sentences(data_dir, dataset: str, fit_corpus: str) -> tuple[str, list[str]]:
    """The unlabeled sentences a calibration is fitted on, and a label saying what they are.

    `target`: every sentence of every split of the dataset (the paper's setting); `train`: the
    train split (datasets without one fall back to target, and the label says so while keeping
    the table row "train"); anything else is a file with one sentence per line.
    """
    if fit_corpus == "target":
        sentences = [s for split in splits(dataset) for s in load_split(data_dir, dataset, split).sentences()]
        return "target", sentences
    if fit_corpus == "train":
        if "train" in splits(dataset):
            return "train", load_split(data_dir, dataset, "train").sentences()
        _, sentences = fit_corpus_sentences(data_dir, dataset, "target")
        return "train (no train split: target)", sentences
    return str(fit_corpus), read_sentence_file(fit_corpus)


# --------------------------------------------------------------------------- evaluation

def evaluate(
    encoder,
    datasets: Iterable[str] = DATASETS,
    calibrations: Iterable[str] = ("none",),
    data_dir=None,
    fit_corpus: str = "target",
    sick_split: str = "test",
    settings: CalibrationSettings = CalibrationSettings(),
    cache: EmbeddingCache | None = None,
    batch_size: int = 64,
    factories: dict[str, Callable[[], object]] | None = None,
    progress: bool = True,
) -> list[dict]:
    """One result record per dataset × calibration for `encoder` (anything with `encode`,
    `model_id`, `pooling`, `dim`). `factories` overrides how a calibrator is built (tests)."""
    from flowcore.sts.data import default_data_dir

    data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
    calibrations = list(calibrations)
    for name in calibrations:
        if name not in CALIBRATIONS:
            raise ValueError(f"unknown calibration {name!r}; choose from {', '.join(CALIBRATIONS)}")
    factories = dict(factories or {})
    cache = cache if cache is not None else EmbeddingCache(None)
    needs_fit = any(name != "none" for name in calibrations)
    file_corpus: tuple[str, np.ndarray] | None = None
    fitted_on_file: dict[str, object] = {}
    records = []
    for dataset in datasets:
        pairs = load_test(data_dir, dataset, sick_split)
        if progress:
            _log(f"{dataset}: {len(pairs)} test pairs")
        left = cache.embed(encoder, pairs.sentences1, batch_size, progress)
        right = cache.embed(encoder, pairs.sentences2, batch_size, progress)
        if needs_fit:
            if fit_corpus in ("target", "train"):
                corpus_label, corpus = fit_corpus_sentences(data_dir, dataset, fit_corpus)
                corpus_vectors = cache.embed(encoder, corpus, batch_size, progress)
            else:
                if file_corpus is None:
                    label, corpus = fit_corpus_sentences(data_dir, dataset, fit_corpus)
                    file_corpus = (label, cache.embed(encoder, corpus, batch_size, progress))
                corpus_label, corpus_vectors = file_corpus
        for name in calibrations:
            record = {"dataset": dataset, "calibration": name, "pooling": str(encoder.pooling),
                      "model": str(encoder.model_id), "split": pairs.split}
            if name != "none":
                record.update(fit_corpus=corpus_label, fit_sentences=len(corpus_vectors),
                              **_settings_record(name, settings))
            started = time.perf_counter()
            try:
                calibrator = fitted_on_file.get(name)
                if calibrator is None:
                    calibrator = factories[name]() if name in factories else build_calibrator(name, settings, progress)
                    if name != "none":
                        if progress:
                            _log(f"{dataset}: fitting {name} on {len(corpus_vectors)} {corpus_label} sentences")
                        calibrator.fit(corpus_vectors)
                    if name != "none" and fit_corpus not in ("target", "train"):
                        fitted_on_file[name] = calibrator
                if getattr(calibrator, "losses", None):
                    record["flow_losses"] = [float(loss) for loss in calibrator.losses]
                a, b = calibrator.transform(left), calibrator.transform(right)
                if not (np.isfinite(a).all() and np.isfinite(b).all()):
                    raise FloatingPointError("the calibrated vectors contain NaN or Inf")
                record.update(score_pairs(cosine_similarity(a, b), pairs))
            except (ValueError, FloatingPointError, RuntimeError) as error:
                _log(f"{dataset}: {name} failed: {error}")
                record.update(spearman=None, pearson=None, n_pairs=len(pairs), error=str(error))
            record["seconds"] = round(time.perf_counter() - started, 3)
            records.append(record)
            if progress and record.get("spearman") is not None:
                _log(f"{dataset}: {name}: Spearman {record['spearman']:.2f}")
    return records


# --------------------------------------------------------------------------- reporting

def _row_label(record: dict) -> str:
    label = f"{record['model']} {record['pooling']}"
    if record["calibration"] == "none":
        return label
    corpus = record.get("fit_corpus", "")
    corpus = corpus.split(" ")[0] if corpus.startswith(("target", "train")) else os.path.basename(corpus)
    detail = record["calibration"]
    if record["calibration"] == "whitening" and record.get("whitening_dim"):
        detail += f"-{record['whitening_dim']}"
    if record["calibration"] == "flow" and record.get("flow_input", "standardize") != "standardize":
        detail += f" on {record['flow_input']} input"
    return f"{label} + {detail} ({corpus})"


def markdown_table(records: list[dict], aggregation: str = "all") -> str:
    """A paper-style table: one row per model/pooling + calibration, one column per dataset,
    then their average (Spearman ×100 under `aggregation` for STS12–16)."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; choose from {', '.join(AGGREGATIONS)}")
    columns = [d for d in DATASETS if any(r["dataset"] == d for r in records)]
    rows: dict[str, dict[str, float | None]] = {}
    for record in records:
        rows.setdefault(_row_label(record), {})[record["dataset"]] = spearman_of(record, aggregation)
    lines = ["| encoder + calibration | " + " | ".join(columns) + " | Avg. |",
             "| --- |" + " ---: |" * (len(columns) + 1)]
    for label, values in rows.items():
        cells = [values.get(d) for d in columns]
        numbers = [v for v in cells if v is not None and not math.isnan(v)]
        average = sum(numbers) / len(numbers) if len(numbers) == len(columns) else None
        lines.append(f"| {label} | " + " | ".join(_cell(v) for v in cells + [average]) + " |")
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.2f}"


def write_json(records: list[dict], path, **header) -> None:
    """`{"results": [...], ...header}` with NaN written as null (valid JSON)."""
    def clean(value):
        if isinstance(value, float) and math.isnan(value):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    document = {**header, "results": clean(records)}
    Path(path).write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
