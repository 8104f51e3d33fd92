"""STS evaluation, the BERT-flow experiment: benchmark data, metrics, the embedding cache, the
calibrations compared, the evaluation protocol and its report."""
