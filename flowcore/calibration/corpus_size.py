"""How large a fit corpus must be: whitening estimates a d×d covariance and the flow a density in
d dimensions, and both are unreliable on fewer than about MIN_ROWS_PER_DIM × d distinct sentences
(docs/lab-notes-calib.md has the measurement behind the rule)."""
from __future__ import annotations

__all__ = ["MIN_ROWS_PER_DIM", "small_corpus_warning"]

MIN_ROWS_PER_DIM = 5


def small_corpus_warning(rows: int, dim: int, option: str = "--fit-corpus FILE", unit: str = "sentences") -> str | None:
    """The warning for a fit corpus of `rows` distinct rows of `dim`-wide vectors, or None when it
    is large enough (at least MIN_ROWS_PER_DIM × dim rows); `option` is how the user passes a
    larger corpus, `unit` what its rows are ("sentences", or "vectors" for stored embeddings)."""
    threshold = MIN_ROWS_PER_DIM * dim
    if rows >= threshold:
        return None
    example = "e.g. NLI sentences " if unit == "sentences" else ""
    return (f"the fit corpus has only {rows} distinct {unit} for {dim}-dimensional vectors, fewer than "
            f"{MIN_ROWS_PER_DIM} x {dim} = {threshold}: whitening and the flow fitted on it are unreliable; "
            f"fit on a larger corpus, {example}via {option}")
