"""`analyze`: the whole analysis of one encoder (or stored vectors) on one corpus, as one JSON-ready dict."""
from __future__ import annotations

import re
import time
from typing import Callable, Iterable

import numpy as np

from flowcore import defaults
from flowcore.analysis import frequency
from flowcore.analysis.advice import ISOTROPY_CAVEAT, advise
from flowcore.analysis.isotropy import isotropy
from flowcore.analysis.lexical import edit_distances, lexical_bias
from flowcore.calibration.auto import AutoCalibration
from flowcore.calibration.corpus_size import small_corpus_warning
from flowcore.sts.baselines import CALIBRATIONS, CalibrationSettings, build_calibrator, reported, settings_record
from flowcore.sts.metrics import cosine_similarity, score_pairs
from flowcore.text.cache import EmbeddingCache
from flowcore.validation import check_matrix

__all__ = ["analyze"]
_UNUSED = re.compile(r"^\[unused\d+\]$")  # BERT's never-trained placeholder entries


def analyze(
    vectors: np.ndarray | None = None,
    *,
    encoder=None,
    sentences: list[str] | None = None,
    corpus_name: str = "corpus",
    pairs: Iterable | None = None,
    calibrations: Iterable[str] = defaults.ANALYZE_CALIBRATIONS,
    settings: CalibrationSettings = CalibrationSettings(),
    frequency_sources: Iterable[str] = ("wordfreq",),
    edit_unit: str = "word",
    random_pairs: int = defaults.RANDOM_PAIRS,
    seed: int = 0,
    cache: EmbeddingCache | None = None,
    batch_size: int = defaults.BATCH_SIZE,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Analyse sentence vectors and the encoder behind them: isotropy before and after each calibration,
    token frequencies, and on labelled pairs each calibration's Spearman, lexical bias and the advice.

    Args:
        vectors: (n, d) corpus vectors; None encodes `sentences` with `encoder`.
        encoder: a `flowcore.Encoder`; without one, only the isotropy of `vectors` is analysed.
        sentences: the corpus (also counted for the "corpus" frequency source).
        pairs: labelled `STSPairs` (e.g. your dev pairs), for the Spearman, lexical bias and advice.
        calibrations: names from `flowcore.sts.CALIBRATIONS`, each fitted on the corpus without labels.
        settings: their hyper-parameters (`flowcore.sts.CalibrationSettings`).
        frequency_sources: "wordfreq" and/or "corpus" (token frequencies counted on `sentences`).
        edit_unit: "word" or "char" edit distance for the lexical bias.
        random_pairs: random pairs drawn for the cosine statistics.
        seed: seeds the random pairs and auto's sample of the corpus.
        cache: an `EmbeddingCache` for the sentence vectors; in memory when None.
        progress: called with one line per step (e.g. print to stderr); None is silent.

    Returns:
        {"model", "pooling", "corpus", "calibrations", "isotropy", "pairs", "frequency", "advice", "caveat"}.

    Example:
        >>> result = analyze(encoder=Encoder(pooling="mean"), sentences=corpus, pairs=[dev_pairs])
        >>> result["advice"]["recommended"], result["advice"]["reason"]
    """
    say = progress or (lambda line: None)
    cache = cache if cache is not None else EmbeddingCache(None)
    calibrations = list(dict.fromkeys(calibrations))
    unknown = [name for name in calibrations if name not in CALIBRATIONS]
    if unknown:
        raise ValueError(f"unknown calibration {', '.join(unknown)}; choose from {', '.join(CALIBRATIONS)}")
    frequency_sources = list(dict.fromkeys(frequency_sources))
    for source in frequency_sources:
        if source not in frequency.FREQUENCY_SOURCES:
            raise ValueError(f"unknown frequency source {source!r}; choose from "
                             f"{', '.join(frequency.FREQUENCY_SOURCES)}")
    if "corpus" in frequency_sources and sentences is None:
        raise ValueError("the 'corpus' frequency source counts tokens in sentences: pass sentences (a text corpus)")
    pairs = list(pairs or [])
    if encoder is None and (vectors is None or pairs or sentences is not None):
        raise ValueError("an encoder is needed to encode sentences or pairs; stored vectors alone give isotropy only")
    if vectors is None:
        if sentences is None:
            raise ValueError("nothing to analyse: pass vectors or sentences")
        say(f"embedding {len(sentences)} corpus sentences with {encoder.model_id} ({encoder.pooling} pooling)")
        vectors = cache.embed(encoder, sentences, batch_size, show_progress_bar=progress is not None)
    check_matrix(vectors, min_rows=2, name="the corpus vectors")  # one clear error naming the bad rows, up front
    distinct = len(set(sentences)) if sentences is not None else len(vectors)
    unit, option = ("sentences", "--input FILE") if sentences is not None else ("vectors", "--embeddings FILE")
    fits = any(name != "none" for name in calibrations)
    small = small_corpus_warning(distinct, vectors.shape[1], option=option, unit=unit) if fits else None
    if small is not None:
        say(f"warning: {small}")
    result = {"model": str(encoder.model_id) if encoder is not None else None,
              "pooling": str(encoder.pooling) if encoder is not None else None,
              "corpus": {"name": corpus_name, "rows": int(len(vectors))},
              "calibrations": {}, "isotropy": {}, "pairs": [], "frequency": {}}
    pair_vectors = []
    for given in pairs:
        say(f"{given.dataset}: embedding {len(given)} pairs")
        pair_vectors.append((cache.embed(encoder, given.sentences1, batch_size, show_progress_bar=False),
                             cache.embed(encoder, given.sentences2, batch_size, show_progress_bar=False)))
    similarities: list[dict[str, np.ndarray]] = [{} for _ in pairs]
    for name in calibrations:
        started = time.perf_counter()
        try:
            calibrator = build_calibrator(name, settings, show_progress_bar=False)
            if name != "none":
                say(f"fitting {name} on {len(vectors)} {corpus_name} vectors")
                calibrator.fit(vectors)
            calibrated = calibrator.transform(vectors)
            mapped = [(calibrator.transform(a), calibrator.transform(b)) for a, b in pair_vectors]
            if not all(np.isfinite(x).all() for x in [calibrated, *[v for pair in mapped for v in pair]]):
                raise FloatingPointError("the calibrated vectors contain NaN or Inf")
        except (ValueError, FloatingPointError, RuntimeError) as error:
            say(f"{name} failed: {error}")
            result["calibrations"][name] = {"error": str(error)}
            continue
        result["isotropy"][name] = isotropy(calibrated, pairs=random_pairs, seed=seed)
        result["calibrations"][name] = {"settings": settings_record(name, settings),
                                        "seconds": round(time.perf_counter() - started, 3)}
        if name != "none":  # what the fit did (auto's choice, a flow's losses and held-out scores)
            result["calibrations"][name].update(reported(calibrator))
        for index, (a, b) in enumerate(mapped):
            similarities[index][name] = cosine_similarity(a, b)
    for given, sims in zip(pairs, similarities):
        distances = edit_distances(given.sentences1, given.sentences2, unit=edit_unit)
        scores = {name: score_pairs(values, given)["spearman"] for name, values in sims.items()}
        result["pairs"].append({
            "dataset": given.dataset, "split": given.split, "n_pairs": len(given), "spearman": scores,
            "lexical_bias": lexical_bias({"gold": given.scores, **sims}, distances), "edit_unit": edit_unit,
            "mean_edit_distance": float(distances.mean())})
    if encoder is not None and frequency_sources:
        result["frequency"] = _frequency(encoder, sentences, frequency_sources, say)
    # each calibration's Spearman averaged over the labelled pair sets (NaN where one failed)
    names = {name for entry in result["pairs"] for name in entry["spearman"]}
    scores = {name: float(np.mean([entry["spearman"][name] for entry in result["pairs"]])) for name in names}
    say("auto's rule on the raw corpus: hubness of its 10-NN graph")
    auto = AutoCalibration(seed=seed).fit(vectors)  # the label-free choice, the same as `flowcore fit`'s default
    result["advice"] = advise(result["isotropy"], scores, warnings=[small] if small else [], auto=auto).to_json()
    result["isotropy"] = {name: value.to_json() for name, value in result["isotropy"].items()}
    result["caveat"] = ISOTROPY_CAVEAT
    return result


def _frequency(encoder, sentences, sources: list[str], say) -> dict:
    say(f"token embeddings of {encoder.model_id}: norms and {'/'.join(map(str, frequency.KNN))}-NN distances by "
        "frequency")
    table = frequency.token_embeddings(encoder)
    neighbours = np.array([index for index, token in enumerate(table.tokens)
                           if index not in table.special_ids and token and not _UNUSED.match(token)])
    out = {}
    for source in sources:
        if source == "wordfreq":
            ranks = frequency.wordfreq_ranks(table.tokens, table.special_ids)
        else:
            ranks = frequency.corpus_ranks(table.tokenizer, sentences, len(table.tokens), table.special_ids)
        buckets, rho = frequency.bucket_statistics(table.vectors, ranks, neighbours=neighbours)
        out[source] = {"buckets": [b.to_json() for b in buckets], "norm_rank_spearman": rho,
                       "ranked_tokens": int((ranks >= 0).sum())}
    return out
