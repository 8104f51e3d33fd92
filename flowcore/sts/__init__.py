"""STS evaluation, the BERT-flow experiment: benchmark data, metrics, the embedding cache, the
calibrations compared, the evaluation protocol and its report. Nothing here imports torch on import."""
from flowcore.sts.baselines import CALIBRATIONS, Baseline, CalibrationSettings, PreFitted, build_calibrator, prefitted
from flowcore.sts.data import (
    DATA_ENV,
    DATASETS,
    STSDataError,
    STSPairs,
    default_data_dir,
    fit_corpus_sentences,
    load_split,
    load_test,
    read_sentence_file,
    splits,
)
from flowcore.sts.metrics import MULTI_SUBSET, correlations, cosine_similarity, score_pairs, spearman_of
from flowcore.sts.pairs import PairColumns, load_pairs, load_pairs_files
from flowcore.sts.protocol import evaluate
from flowcore.sts.report import AGGREGATION_NOTES, AGGREGATIONS, markdown_table, write_json
from flowcore.text.cache import CACHE_ENV, EmbeddingCache, default_cache_dir

__all__ = ["AGGREGATIONS", "AGGREGATION_NOTES", "CACHE_ENV", "CALIBRATIONS", "DATASETS", "DATA_ENV", "MULTI_SUBSET",
           "CalibrationSettings", "EmbeddingCache", "Baseline", "PairColumns", "PreFitted", "STSDataError", "STSPairs",
           "build_calibrator", "correlations", "cosine_similarity", "default_cache_dir", "default_data_dir",
           "evaluate", "fit_corpus_sentences", "load_pairs", "load_pairs_files", "load_split", "load_test",
           "markdown_table", "prefitted", "read_sentence_file", "score_pairs", "spearman_of", "splits", "write_json"]
