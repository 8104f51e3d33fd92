"""The small-fit-corpus warning fires below MIN_ROWS_PER_DIM × dim distinct rows, and only there."""
from flowcore.calibration.corpus_size import MIN_ROWS_PER_DIM, small_corpus_warning


def test_warning_below_the_threshold_names_rows_dim_and_threshold():
    message = small_corpus_warning(500, 384)
    assert MIN_ROWS_PER_DIM == 5
    assert "500 distinct sentences" in message and "384-dimensional" in message and "5 x 384 = 1920" in message
    assert "NLI sentences via --fit-corpus FILE" in message
    assert "--input FILE" in small_corpus_warning(10, 16, option="--input FILE")
    vectors = small_corpus_warning(10, 16, option="a larger --max-rows", unit="vectors")
    assert "10 distinct vectors" in vectors and "NLI" not in vectors and vectors.endswith("via a larger --max-rows")


def test_no_warning_at_or_above_the_threshold():
    assert small_corpus_warning(1920, 384) is None
    assert small_corpus_warning(10**6, 768) is None
    assert small_corpus_warning(1919, 384) is not None
