"""Test setup. TRITON_INTERPRET must be set before any kernel module is imported, so that the
Triton kernels run on the CPU in the interpreter. The embedding cache is a folder of the session's
own, removed at its end: tests never read or fill the user's."""
import atexit
import os
import shutil
import tempfile

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ["FLOWCORE_CACHE"] = tempfile.mkdtemp(prefix="flowcore-test-cache-")
atexit.register(shutil.rmtree, os.environ["FLOWCORE_CACHE"], ignore_errors=True)

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import flowcore  # noqa: E402, F401  (first: it keeps the checkout's kernels/ from passing for Hugging Face's `kernels`)

REPO = Path(__file__).resolve().parents[1]
STS_DATA = Path(os.environ.get("FLOWCORE_DATA") or REPO.parent / "shared" / "data" / "sts")


# Tests run many tiny ops; one thread avoids OpenMP spin-waits that make them 10-50x slower
# whenever the two cores are shared with anything else.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def sts_data_dir() -> Path:
    """The read-only STS folder (`../shared/data/sts`, or $FLOWCORE_DATA)."""
    if not (STS_DATA / "STSBenchmark").is_dir():
        pytest.fail(f"STS data not found at {STS_DATA}; set FLOWCORE_DATA")
    return STS_DATA


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> str:
    """A random 3-layer BERT (hidden size 16) over `helpers.tiny_models.WORDS`, saved like a hub model folder."""
    from helpers.tiny_models import WORDS, save_tiny_bert

    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"), WORDS, hidden_size=16, num_layers=3)


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
    yield
