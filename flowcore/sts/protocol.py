"""The STS evaluation protocol of the BERT-flow experiment: frozen encoder → calibration
(none | whitening | flow, fitted without labels) → cosine similarity → Spearman/Pearson ×100,
one result record per dataset × calibration.

Everything heavy is injectable (the encoder, the calibrator factories), so the protocol can be
tested with stand-ins; sentence vectors go through an `EmbeddingCache`.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from flowcore.calibration.corpus_size import small_corpus_warning
from flowcore.sts.baselines import CALIBRATIONS, CalibrationSettings, PreFitted, build_calibrator, settings_record
from flowcore.sts.cache import EmbeddingCache
from flowcore.sts.data import DATASETS, STSPairs, default_data_dir, fit_corpus_sentences, load_test
from flowcore.sts.metrics import cosine_similarity, score_pairs

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
    batch_size: int = 64,
    factories: dict[str, Callable[[], object]] | None = None,
    progress: bool = True,
    pairs: Iterable[STSPairs] | None = None,
    fitted: dict[str, PreFitted] | None = None,
) -> list[dict]:
    """Evaluate `encoder` on each dataset, raw and after each calibration.

    A calibration that fails (an error, or NaN/Inf vectors) is kept as a record with
    `spearman=None` and its `error`, and logged as a warning; the others go on.

    Args:
        encoder: anything with `encode`, `model_id`, `pooling`, `dim` (see `EmbeddingCache.embed`).
        datasets: names from `DATASETS`, evaluated in this order.
        calibrations: names from `CALIBRATIONS`, applied to each dataset in this order.
        data_dir: the STS data folder; $FLOWCORE_DATA when None.
        fit_corpus: what whitening/flow are fitted on, without labels: "target" (every sentence
            of every split of the evaluated dataset), "train" (its train split where it has one),
            or a file with one sentence per line (fitted once, reused for every dataset).
        sick_split: the SICK-R pairs scored, "test" or "all".
        settings: hyper-parameters of the fitted calibrations, recorded with their results.
        cache: where sentence vectors are kept; a fresh in-memory cache when None.
        batch_size: the encoding batch size.
        factories: `{calibration name: zero-argument factory}` overriding `build_calibrator`,
            e.g. for a calibrator of your own or a stand-in.
        progress: log progress (INFO on the `flowcore.sts` loggers) and show the encoder's progress bar.
        pairs: labelled pairs of your own (e.g. `flowcore.sts.pairs.load_pairs`), evaluated instead
            of `datasets` (then `data_dir` is not read); "target" fits on each one's own sentences.
        fitted: `{calibration name: PreFitted}`, calibrators already fitted (e.g. a flow file,
            `baselines.prefitted_flow`), applied as they are: nothing is fitted for them.

    Returns:
        One record (a JSON-ready dict) per dataset × calibration: dataset, calibration, pooling,
        model, split, the correlations of `score_pairs` (Spearman/Pearson ×100, subsets and
        aggregations for STS12–16), seconds; for fitted calibrations also fit_corpus,
        fit_sentences, fit_distinct_sentences and their settings, `flow_losses` for the flow (and,
        with a held-out share, `flow_heldout_bits_per_dim` per epoch and `flow_selected_epoch`), and
        `warning` when the fit corpus is too small (`small_corpus_warning`, also logged: once per
        fitted corpus, so once for a file corpus, in every record); for
        `pairs` also pairs_file and skipped_lines; for `fitted` ones fit_corpus (the source) and
        their recorded settings.
    """
    calibrations = list(calibrations)
    for name in calibrations:
        if name not in CALIBRATIONS:
            raise ValueError(f"unknown calibration {name!r}; choose from {', '.join(CALIBRATIONS)}")
    if pairs is not None:
        if fit_corpus == "train":
            raise ValueError("fit corpus 'train' needs the built-in datasets: your pairs have no train split; "
                             "use 'target' (their own sentences) or a file with one sentence per line")
        items = [(p.dataset, p) for p in pairs]
    else:
        data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
        items = [(dataset, None) for dataset in datasets]
    factories = dict(factories or {})
    fitted = dict(fitted or {})
    cache = cache if cache is not None else EmbeddingCache(None)
    needs_fit = any(name != "none" and name not in fitted for name in calibrations)
    file_corpus: tuple[str, np.ndarray, int, str | None] | None = None  # fitted once, reused: warned once
    fitted_on_file: dict[str, object] = {}
    records = []
    for dataset, given in items:
        pairs_ = given if given is not None else load_test(data_dir, dataset, sick_split)
        if progress:
            logger.info(f"{dataset}: {len(pairs_)} {'test ' if given is None else ''}pairs")
        left = cache.embed(encoder, pairs_.sentences1, batch_size, progress)
        right = cache.embed(encoder, pairs_.sentences2, batch_size, progress)
        warning = None
        if needs_fit:
            if fit_corpus in ("target", "train"):
                if given is not None:
                    corpus_label, corpus = "target", given.sentences()
                else:
                    corpus_label, corpus = fit_corpus_sentences(data_dir, dataset, fit_corpus)
                corpus_vectors = cache.embed(encoder, corpus, batch_size, progress)
                distinct = len(set(corpus))
                warning = small_corpus_warning(distinct, corpus_vectors.shape[1])
                if warning is not None:
                    logger.warning(f"{dataset}: {warning}")
            else:
                if file_corpus is None:
                    label, corpus = fit_corpus_sentences(data_dir, dataset, fit_corpus)
                    vectors, count = cache.embed(encoder, corpus, batch_size, progress), len(set(corpus))
                    file_corpus = (label, vectors, count, small_corpus_warning(count, vectors.shape[1]))
                    if file_corpus[3] is not None:
                        logger.warning(f"{label}: {file_corpus[3]}")
                corpus_label, corpus_vectors, distinct, warning = file_corpus
        for name in calibrations:
            record = {"dataset": dataset, "calibration": name, "pooling": str(encoder.pooling),
                      "model": str(encoder.model_id), "split": pairs_.split}
            if given is not None:
                record.update(pairs_file=given.source, skipped_lines=given.skipped_lines)
            if name in fitted:
                record.update(fit_corpus=fitted[name].source, **fitted[name].record)
            elif name != "none":
                record.update(fit_corpus=corpus_label, fit_sentences=len(corpus_vectors),
                              fit_distinct_sentences=distinct, **settings_record(name, settings))
                if warning is not None:
                    record["warning"] = warning
            started = time.perf_counter()
            try:
                calibrator = fitted[name].calibrator if name in fitted else fitted_on_file.get(name)
                if calibrator is None:
                    calibrator = factories[name]() if name in factories else build_calibrator(name, settings, progress)
                    if name != "none":
                        if progress:
                            logger.info(f"{dataset}: fitting {name} on {len(corpus_vectors)} {corpus_label} sentences")
                        calibrator.fit(corpus_vectors)
                    if name != "none" and fit_corpus not in ("target", "train"):
                        fitted_on_file[name] = calibrator
                if getattr(calibrator, "losses", None):
                    record["flow_losses"] = [float(loss) for loss in calibrator.losses]
                if getattr(calibrator, "heldout_bits_per_dim", None):  # the recipe's unsupervised epoch choice
                    record["flow_heldout_bits_per_dim"] = list(calibrator.heldout_bits_per_dim)
                    record["flow_selected_epoch"] = calibrator.selected_epoch
                a, b = calibrator.transform(left), calibrator.transform(right)
                if not (np.isfinite(a).all() and np.isfinite(b).all()):
                    raise FloatingPointError("the calibrated vectors contain NaN or Inf")
                record.update(score_pairs(cosine_similarity(a, b), pairs_))
            except (ValueError, FloatingPointError, RuntimeError) as error:
                logger.warning(f"{dataset}: {name} failed: {error}")
                record.update(spearman=None, pearson=None, n_pairs=len(pairs_), error=str(error))
            record["seconds"] = round(time.perf_counter() - started, 3)
            records.append(record)
            if progress and record.get("spearman") is not None:
                logger.info(f"{dataset}: {name}: Spearman {record['spearman']:.2f}")
    return records
