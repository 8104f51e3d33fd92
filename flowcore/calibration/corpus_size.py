"""How large a fit corpus must be: whitening (a d×d covariance) and the flow (a density in d dimensions)
are unreliable on fewer than about MIN_ROWS_PER_DIM × d distinct sentences."""
from __future__ import annotations

__all__ = ["MIN_ROWS_PER_DIM", "small_corpus_warning"]

MIN_ROWS_PER_DIM = 5


def small_corpus_warning(rows: int, dim: int, option: str = "--fit-corpus FILE", unit: str = "sentences") -> str | None:
    """The warning for a fit corpus of `rows` distinct `dim`-wide rows, None when large enough; `option`
    is how the user passes a larger corpus, `unit` what its rows are ("sentences" or "vectors")."""
    threshold = MIN_ROWS_PER_DIM * dim
    if rows >= threshold:
        return None
    example = "e.g. NLI sentences " if unit == "sentences" else ""
    return (f"the fit corpus has only {rows} distinct {unit} for {dim}-dimensional vectors, fewer than "
            f"{MIN_ROWS_PER_DIM} x {dim} = {threshold}: whitening and the flow fitted on it are unreliable; "
            f"fit on a larger corpus, {example}via {option}")
