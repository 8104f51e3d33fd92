"""The export tests' tiny BERT (over `helpers.tiny_models.SENTENCE_WORDS`) and the sentences a calibrator is
fitted on."""
import numpy as np
import pytest

from helpers.tiny_models import SENTENCE_WORDS, save_tiny_bert


@pytest.fixture(scope="session")
def bert(tmp_path_factory) -> str:
    return save_tiny_bert(tmp_path_factory.mktemp("bert"), SENTENCE_WORDS, hidden_size=16, num_layers=3)


@pytest.fixture(scope="session")
def sentences() -> list[str]:
    rng = np.random.default_rng(0)
    return [" ".join(rng.choice(SENTENCE_WORDS, size=int(rng.integers(2, 10)))) for _ in range(300)]
