"""The STS evaluation protocol of the BERT-flow experiment: frozen encoder → calibration fitted
without labels → cosine similarity → Spearman/Pearson ×100, a record per dataset × calibration."""
from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np

from flowcore import defaults
from flowcore._progress import progress_wanted
from flowcore.calibration.corpus_size import small_corpus_warning
from flowcore.runtime import use_threads_in_this_process
from flowcore.sts.baselines import (
    CALIBRATIONS,
    CalibrationSettings,
    PreFitted,
    build_calibrator,
    reported,
    settings_record,
)
from flowcore.sts.data import DATASETS, STSPairs, default_data_dir, fit_corpus_sentences, load_test
from flowcore.sts.metrics import cosine_similarity, score_pairs
from flowcore.text.cache import EmbeddingCache

__all__ = ["evaluate"]

logger = logging.getLogger(__name__)


def evaluate(
    encoder,
    datasets: Iterable[str] = DATASETS,
    calibrations: Iterable[str] = ("none",),
    data_dir=None,
    fit_corpus: str = "target",
    sick_split: str = "test",
    settings: CalibrationSettings = CalibrationSettings(),
    cache: EmbeddingCache | None = None,
    batch_size: int = defaults.BATCH_SIZE,
    show_progress_bar: bool | None = None,
    pairs: Iterable[STSPairs] | None = None,
    fitted: dict[str, PreFitted] | None = None,
    jobs: int = 1,
) -> list[dict]:
    """Evaluate `encoder` on each dataset, raw and after each calibration.

    A calibration that fails (an error, or NaN/Inf vectors) is kept as a record with
    `spearman=None` and its `error`, and logged as a warning; the others go on.

    Args:
        encoder: anything with `encode`, `model_id`, `pooling`, `dim` (see `EmbeddingCache.embed`).
        datasets: names from `DATASETS`, evaluated in this order.
        calibrations: names from `CALIBRATIONS`, applied to each dataset in this order.
        data_dir: the STS data folder; $FLOWCORE_DATA when None.
        fit_corpus: what calibrations are fitted on: "target", "train" (`fit_corpus_sentences`) or a file.
        sick_split: the SICK-R pairs scored, "test" or "all".
        settings: hyper-parameters of the fitted calibrations, recorded with their results.
        cache: where sentence vectors are kept; a fresh in-memory cache when None.
        show_progress_bar: progress bars and INFO progress lines; None: when stderr is a terminal.
        pairs: labelled pairs of your own (`flowcore.sts.pairs.load_pairs`), evaluated instead of `datasets`.
        fitted: `{calibration name: PreFitted}`, calibrators already fitted, applied as they are.
        jobs: datasets whose flows are fitted at once in forked one-thread processes (same results; CPU).

    Returns:
        One JSON-ready record per dataset × calibration: dataset, calibration, pooling, model, split,
        the correlations of `score_pairs`, seconds; for fitted calibrations their fit corpus, settings,
        flow losses and held-out scores, auto's `auto_choice` and `auto_signals`, and any small-corpus
        `warning`; for `pairs` also pairs_file and skipped_lines.
    """
    progress = progress_wanted(show_progress_bar)
    calibrations = list(calibrations)
    for name in calibrations:
        if name not in CALIBRATIONS:
            raise ValueError(f"unknown calibration {name!r}; choose from {', '.join(CALIBRATIONS)}")
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    if pairs is not None:
        if fit_corpus == "train":
            raise ValueError("fit corpus 'train' needs the built-in datasets: your pairs have no train split; "
                             "use 'target' (their own sentences) or a file with one sentence per line")
        items = [(p.dataset, p) for p in pairs]
    else:
        data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
        items = [(dataset, None) for dataset in datasets]
    fitted = dict(fitted or {})
    cache = cache if cache is not None else EmbeddingCache(None)
    needs_fit = any(name != "none" and name not in fitted for name in calibrations)

    def embedded_corpus(label: str, sentences: list[str], name: str) -> tuple[str, np.ndarray, int, str | None]:
        """(label, vectors, distinct sentences, small-corpus warning) of a fit corpus; the warning logged."""
        vectors, distinct = cache.embed(encoder, sentences, batch_size, progress), len(set(sentences))
        warning = small_corpus_warning(distinct, vectors.shape[1])
        if warning is not None:
            logger.warning(f"{name}: {warning}")
        return label, vectors, distinct, warning

    file_corpus = None  # fitted once, reused: warned once
    prepared = []
    for dataset, given in items:
        pairs_ = given if given is not None else load_test(data_dir, dataset, sick_split)
        if progress:
            logger.info(f"{dataset}: {len(pairs_)} {'test ' if given is None else ''}pairs")
        left = cache.embed(encoder, pairs_.sentences1, batch_size, progress)
        right = cache.embed(encoder, pairs_.sentences2, batch_size, progress)
        corpus = (None, None, 0, None)
        if needs_fit and fit_corpus in ("target", "train"):
            if given is not None:
                corpus = embedded_corpus("target", given.sentences(), dataset)
            else:
                corpus = embedded_corpus(*fit_corpus_sentences(data_dir, dataset, fit_corpus), dataset)
        elif needs_fit:
            if file_corpus is None:  # its label is the file's name
                file_corpus = embedded_corpus(*fit_corpus_sentences(data_dir, dataset, fit_corpus), fit_corpus)
            corpus = file_corpus
        prepared.append(_Dataset(given, pairs_, left, right, *corpus))
    scorer = _Scorer(calibrations, settings, fitted, fit_corpus, progress, str(encoder.pooling), str(encoder.model_id))
    if jobs > 1 and len(prepared) > 1 and fit_corpus in ("target", "train") and _fits_in_parallel(scorer):
        return _score_in_processes(scorer, prepared, min(jobs, len(prepared)))
    return [record for item in prepared for record in scorer(item)]


@dataclass
class _Dataset:
    """One dataset's pairs, their vectors and its fit corpus, ready for its calibrations."""

    given: STSPairs | None
    pairs: STSPairs
    left: np.ndarray
    right: np.ndarray
    corpus_label: str | None
    corpus_vectors: np.ndarray | None
    distinct: int
    warning: str | None


@dataclass
class _Scorer:
    """Fits and applies each calibration to one `_Dataset` and scores it: its records."""

    calibrations: list[str]
    settings: CalibrationSettings
    fitted: dict
    fit_corpus: str
    progress: bool
    pooling: str
    model: str
    bars: bool = True
    fitted_on_file: dict = field(default_factory=dict)

    def __call__(self, item: _Dataset) -> list[dict]:
        records = []
        dataset, pairs_, given = item.pairs.dataset, item.pairs, item.given
        for name in self.calibrations:
            record = {"dataset": dataset, "calibration": name, "pooling": self.pooling, "model": self.model,
                      "split": pairs_.split}
            if given is not None:
                record.update(pairs_file=given.source, skipped_lines=given.skipped_lines)
            if name in self.fitted:
                record.update(fit_corpus=self.fitted[name].source, **self.fitted[name].record)
            elif name != "none":
                record.update(fit_corpus=item.corpus_label, fit_sentences=len(item.corpus_vectors),
                              fit_distinct_sentences=item.distinct, **settings_record(name, self.settings))
                if item.warning is not None:
                    record["warning"] = item.warning
            started = time.perf_counter()
            try:
                calibrator = self.fitted[name].calibrator if name in self.fitted else self.fitted_on_file.get(name)
                if calibrator is None:
                    calibrator = build_calibrator(name, self.settings, self.progress and self.bars)
                    if name != "none":
                        if self.progress:
                            logger.info(f"{dataset}: fitting {name} on {len(item.corpus_vectors)} "
                                        f"{item.corpus_label} sentences")
                        calibrator.fit(item.corpus_vectors)
                        if self.fit_corpus not in ("target", "train"):
                            self.fitted_on_file[name] = calibrator
                if name != "none" and name not in self.fitted:  # what the fit did (auto's choice, a flow's scores)
                    record.update(reported(calibrator))
                a, b = calibrator.transform(item.left), calibrator.transform(item.right)
                if not (np.isfinite(a).all() and np.isfinite(b).all()):
                    raise FloatingPointError("the calibrated vectors contain NaN or Inf")
                record.update(score_pairs(cosine_similarity(a, b), pairs_))
            except (ValueError, FloatingPointError, RuntimeError) as error:
                logger.warning(f"{dataset}: {name} failed: {error}")
                record.update(spearman=None, pearson=None, n_pairs=len(pairs_), error=str(error))
            record["seconds"] = round(time.perf_counter() - started, 3)
            records.append(record)
            if self.progress and record.get("spearman") is not None:
                logger.info(f"{dataset}: {name}: Spearman {record['spearman']:.2f}")
        return records


def _fits_in_parallel(scorer: _Scorer) -> bool:
    """Worth and safe to fit in forked one-thread processes: a calibration trains on one CPU thread, where fork
    exists (a forked child can use neither CUDA nor multi-threaded OpenMP)."""
    if "fork" not in multiprocessing.get_all_start_methods() or scorer.settings.device not in (None, "cpu"):
        return False
    return any(build_calibrator(name, scorer.settings).fit_threads() == 1
               for name in scorer.calibrations if name not in scorer.fitted)


_WORK: tuple[_Scorer, list[_Dataset]] | None = None
"""The scorer and datasets of `_score_in_processes`, inherited by its forked workers (not pickled)."""


def _score_in_processes(scorer: _Scorer, prepared: list[_Dataset], workers: int) -> list[dict]:
    """`scorer` on each dataset in `workers` forked processes, largest fit corpus first; records in dataset order."""
    global _WORK
    _WORK = (dataclasses.replace(scorer, bars=False), prepared)  # parallel progress bars would interleave
    order = sorted(range(len(prepared)), key=lambda index: -len(prepared[index].corpus_vectors))
    try:
        with multiprocessing.get_context("fork").Pool(workers, initializer=_start_worker) as pool:
            results = dict(zip(order, pool.map(_score_one, order, chunksize=1)))
    finally:
        _WORK = None
    return [record for index in range(len(prepared)) for record in results[index]]


def _start_worker() -> None:
    """A forked worker ends on the pool's SIGTERM (an inherited handler, e.g. Ray's, could hang the pool),
    leaves Ctrl-C to the parent, and trains on one thread."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    use_threads_in_this_process()


def _score_one(index: int) -> list[dict]:
    scorer, prepared = _WORK
    return scorer(prepared[index])
