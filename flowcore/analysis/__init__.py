"""The BERT-flow paper's analyses and "does calibration help here?" (`flowcore analyze`).

Example:
    >>> from flowcore.analysis import analyze, write_report
    >>> write_report(analyze(encoder=Encoder(pooling="mean"), sentences=corpus, pairs=[dev]), "out/")
"""
from flowcore.analysis.advice import ISOTROPY_CAVEAT, Advice, advise, balanced_neighbourhoods_warning
from flowcore.analysis.analyze import analyze
from flowcore.analysis.frequency import bucket_statistics, corpus_ranks, token_embeddings, wordfreq_ranks
from flowcore.analysis.isotropy import Isotropy, effective_rank, isoscore, isotropy, random_pair_cosines
from flowcore.analysis.lexical import edit_distances, lexical_bias
from flowcore.analysis.report import summary_markdown, write_report

__all__ = ["ISOTROPY_CAVEAT", "Advice", "Isotropy", "advise", "analyze",
           "balanced_neighbourhoods_warning", "bucket_statistics", "corpus_ranks", "edit_distances", "effective_rank",
           "isoscore", "isotropy", "lexical_bias", "random_pair_cosines", "summary_markdown", "token_embeddings",
           "wordfreq_ranks", "write_report"]
