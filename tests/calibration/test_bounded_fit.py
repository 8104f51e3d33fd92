"""`FlowCalibrator.fit` on a memory map: the same model as in memory, and no copy of X on the way."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import flowcore
from flowcore.calibration.flow import _whitening_start
from flowcore.calibration.standardize import Standardizer
from flowcore.calibration.whitening import Whitening
from flowcore.defaults import STAT_BLOCK_ROWS


def corpus(rows=17000, dim=8, seed=0):
    """Non-Gaussian, anisotropic vectors with one constant coordinate (it bypasses the flow)."""
    rng = np.random.default_rng(seed)
    X = np.tanh(rng.normal(size=(rows, dim)) @ rng.normal(size=(dim, dim)) * 2 + 1).astype(np.float32)
    X[:, 2] = 0.25
    return X


@pytest.fixture(scope="module")
def mapped(tmp_path_factory):
    X = corpus()
    path = tmp_path_factory.mktemp("bounded") / "corpus.npy"
    np.save(path, X)
    return X, np.load(path, mmap_mode="r")


def fitted(X, **options):
    return flowcore.FlowCalibrator("l2_d2_w32", epochs=2, batch_size=1024, lr=5e-3, seed=5).fit(
        X, show_progress_bar=False, **options)


def test_a_memory_mapped_fit_equals_the_in_memory_fit(mapped):
    X, memmap = mapped
    assert len(X) > 2 * STAT_BLOCK_ROWS  # the statistics are summed over several blocks
    in_memory, from_map = fitted(X), fitted(memmap)
    assert from_map.selected_epoch == in_memory.selected_epoch and from_map.selected_epoch > 0  # a trained epoch
    assert from_map.heldout_bits_per_dim == in_memory.heldout_bits_per_dim
    np.testing.assert_array_equal(from_map.transform(X[:3000]), in_memory.transform(X[:3000]))


def test_block_statistics_match_whole_matrix_float64_to_rounding(mapped):
    X, memmap = mapped
    standardizer = Standardizer(X.shape[1]).fit(torch.from_numpy(np.asarray(memmap)))
    exact = X.astype(np.float64)
    varying = standardizer.varying.numpy()
    assert varying.tolist() == [i != 2 for i in range(X.shape[1])]
    np.testing.assert_allclose(standardizer.mean.numpy(), exact.mean(0), rtol=1e-12, atol=0)
    np.testing.assert_allclose(standardizer.scale.numpy()[varying], exact.std(0)[varying], rtol=1e-12, atol=0)
    # the whitening start from blockwise moments equals BERT-whitening of the whole standardised matrix
    weight, loc = _whitening_start(torch.from_numpy(X), None, standardizer.flow_input)
    eager = Whitening().fit(standardizer.flow_input(torch.from_numpy(X)).double().numpy())
    np.testing.assert_allclose(loc.numpy(), -eager.mean, rtol=0, atol=1e-12)
    signs = np.sign((weight.numpy()[: eager.output_dim] * eager.matrix.T).sum(1, keepdims=True))  # eigh's sign
    np.testing.assert_allclose(weight.numpy()[: eager.output_dim] * signs, eager.matrix.T, rtol=1e-9, atol=1e-9)


def test_fitting_on_chosen_rows_equals_fitting_on_their_copy(mapped):
    X, memmap = mapped
    damaged = np.array(X[:6000])
    damaged[::7] = np.nan  # rejected rows: never read, since they are not chosen
    good = np.flatnonzero(np.isfinite(damaged).all(1))
    on_rows, on_copy = fitted(damaged, rows=good), fitted(damaged[good])
    assert on_rows.heldout_bits_per_dim == on_copy.heldout_bits_per_dim
    np.testing.assert_array_equal(on_rows.transform(X[:500]), on_copy.transform(X[:500]))
    without_holdout = [flowcore.FlowCalibrator("l2_d2_w32", recipe="standardized", batch_size=1024, seed=5).fit(
        data, show_progress_bar=False, **options) for data, options in ((damaged, {"rows": good}), (damaged[good], {}))]
    np.testing.assert_array_equal(*(calibrator.transform(X[:500]) for calibrator in without_holdout))
    with pytest.raises(ValueError, match=r"NaN or Inf values in row\(s\) 0, 7"):
        fitted(damaged, rows=np.arange(len(damaged)))
    with pytest.raises(ValueError, match="row number 6000, outside X's 6000 row"):
        fitted(damaged, rows=[0, 1, 6000])
    with pytest.raises(ValueError, match="rows selects 1 row"):
        fitted(damaged, rows=[1])


def test_training_on_rows_through_prepare_equals_training_on_the_prepared_copy():
    X = corpus(rows=3000, dim=11, seed=1)
    rows = np.random.default_rng(2).permutation(len(X))[:2000]

    def scaled(batch):
        return (batch[:, 3:] - 0.5) * 3  # drops the constant coordinate 2

    results = []
    for data, options in ((X, {"rows": rows, "prepare": scaled}), (scaled(torch.from_numpy(X[rows])), {})):
        torch.manual_seed(0)
        glow = flowcore.Glow(8, levels=2, depth=2, width=8)
        losses = flowcore.fit(glow, data, epochs=2, batch_size=256, seed=3, show_progress_bar=False, **options)
        results.append((losses, {name: value.clone() for name, value in glow.state_dict().items()}))
    assert results[0][0] == results[1][0]
    for name, value in results[0][1].items():
        torch.testing.assert_close(value, results[1][1][name], rtol=0, atol=0)


BOUNDED_FIT = """
    import resource, sys
    import numpy as np, torch
    import flowcore
    torch.set_num_threads(1)
    path, margin = sys.argv[1], int(sys.argv[2])
    X = np.load(path, mmap_mode="r")
    options = dict(config="l2_d2_w32", epochs=1, batch_size=2048, seed=0, holdout=0.02)  # working memory << margin
    flowcore.FlowCalibrator(**options).fit(np.array(X[:4000]), show_progress_bar=False)  # warm up every code path
    with open("/proc/self/status") as status:
        data_kib = next(int(line.split()[1]) for line in status if line.startswith("VmData:"))
    limit = data_kib * 1024 + margin
    resource.setrlimit(resource.RLIMIT_DATA, (limit, resource.getrlimit(resource.RLIMIT_DATA)[1]))
    calibrator = flowcore.FlowCalibrator(**options).fit(X, show_progress_bar=False)
    print("fitted", calibrator.selected_epoch, calibrator.flow.dim)
    try:
        np.array(X)  # one copy of X: what the limit forbids
    except MemoryError:
        print("a copy of X is refused")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA bounds private memory on Linux")
def test_a_memory_mapped_fit_makes_no_copy_of_the_rows(tmp_path):
    """With private (non-file) memory capped at three quarters of X's size above what the process already
    uses, the fit on a memory map still succeeds; a single copy of X does not. One malloc arena: a thread's
    own arena reserves 64 MiB of address space, which the cap counts though nothing is copied."""
    rows, dim = 400_000, 64  # 102 MB of float32
    path = tmp_path / "big.npy"
    matrix = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, dim))
    rng = np.random.default_rng(0)
    mixing = rng.normal(size=(dim, dim)).astype(np.float32)
    for start in range(0, rows, 100_000):
        matrix[start : start + 100_000] = rng.standard_normal((100_000, dim), dtype=np.float32) @ mixing
    matrix.flush()
    del matrix
    margin = rows * dim * 4 * 3 // 4
    environment = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",  # no BLAS spin-waits
                   "MALLOC_ARENA_MAX": "1"}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(BOUNDED_FIT), str(path), str(margin)],
                            capture_output=True, text=True, timeout=300, env=environment)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "fitted" in result.stdout and f" {dim}" in result.stdout
    assert "a copy of X is refused" in result.stdout
